"""Shared engines: reference-counted claims, per-call truncation, fork and spawn children, pickling."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
from forking import run_in_child

from rbln_retrieval import PoolingEngine, get_engine
from rbln_retrieval.errors import EngineForkedError

# Engine options of the tests below: their own engine (max_length differs from the session engine), so closing
# it never touches the session engine of the other modules.
OWN = {"device": "cpu", "dtype": "float32", "max_length": 128}
LONG = " ".join(f"w{i}" for i in range(400))


def test_closing_one_holder_never_affects_another_and_the_last_frees_the_engine(minilm):
    first = PoolingEngine.shared(minilm, **OWN)
    second = get_engine(minilm, truncate="error", **OWN)  # truncate is per call: the same engine
    engine = first.engine
    assert second.engine is engine
    first.close()
    first.close()  # idempotent: releases its own claim once
    assert second.embed(["still served"]).shape == (1, 384)
    with pytest.raises(RuntimeError, match="was closed"):
        first.embed(["x"])
    with get_engine(minilm, **OWN) as third:
        assert third.engine is engine
    assert not engine.closed  # `second` still holds it
    second.close()
    assert engine.closed


def test_truncate_travels_with_the_call(minilm, minilm_engine):
    ending = get_engine(minilm, device="cpu", dtype="float32", truncate="start")
    assert ending.engine is minilm_engine.engine
    head, tail = minilm_engine.embed([LONG]), ending.embed([LONG])
    assert float(head[0] @ tail[0]) < 0.99  # different halves of the text
    np.testing.assert_allclose(minilm_engine.embed([LONG], truncate="start"), tail, atol=1e-6)
    with pytest.raises(ValueError, match=r"texts\[0\] is \d+ tokens, over max_length=256"):
        minilm_engine.embed([LONG], truncate="error")
    with pytest.raises(ValueError, match="truncate='middle' is not one of"):
        minilm_engine.embed([LONG], truncate="middle")


def _embed_in_child(handle) -> list[float]:
    return handle.embed(["forked"])[0].tolist()


def _raw_engine_in_child(engine) -> tuple[str, float]:
    start = time.monotonic()
    try:
        engine.embed(["forked"])
    except EngineForkedError as exc:
        return str(exc), time.monotonic() - start
    return "no error", time.monotonic() - start


def test_a_forked_child_gets_a_fresh_engine_and_never_hangs(minilm, minilm_engine):
    expected = minilm_engine.embed(["forked"])[0]
    result = run_in_child("fork", _embed_in_child, minilm_engine)
    assert result[0] == "ok", result
    np.testing.assert_allclose(result[1], expected, atol=1e-5)
    assert minilm_engine.embed(["forked"]).shape == (1, 384)  # the parent's engine is untouched


def test_a_parent_engine_used_directly_in_a_forked_child_raises_one_sentence_at_once(minilm_engine):
    status, (message, seconds) = run_in_child("fork", _raw_engine_in_child, minilm_engine.engine, deadline=60)
    assert status == "ok"
    assert message.startswith("This engine was started in process ") and "forked child" in message
    assert seconds < 1.0


def test_a_spawned_child_attaches_a_pickled_handle_on_first_use(minilm, minilm_engine):
    handle = pickle.loads(pickle.dumps(minilm_engine))
    assert handle.engine is minilm_engine.engine  # same process: joins the shared engine
    result = run_in_child("spawn", _embed_in_child, minilm_engine, deadline=600)
    assert result[0] == "ok", result
    np.testing.assert_allclose(result[1], minilm_engine.embed(["forked"])[0], atol=1e-5)
