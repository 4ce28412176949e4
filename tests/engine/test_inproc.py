"""The in-process engine (the default): vLLM runs inside this process on the bundled platform and attention, even
when vLLM was imported first; two engines of one process computing at once stay correct; the driver sleeps while
idle; close() ends the step thread."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from corpus import mixed_length

from rbln_retrieval import PoolingEngine
from rbln_retrieval.backend.platform import BundledPlatform
from rbln_retrieval.local.inproc import InprocEngine

# vLLM picks its platform on this first import, before rbln_retrieval ever starts an engine (the in-process NaN:
# vLLM's CPU platform then gave the bundled runner vLLM's CPU attention, which breaks on padded buckets).
VLLM_FIRST = """
import json, sys
from vllm import EngineArgs  # noqa: F401
from rbln_retrieval import PoolingEngine
with PoolingEngine(sys.argv[1], device="cpu", dtype="float32") as engine:
    print(json.dumps([type(engine._vllm).__name__, engine.embed(json.loads(sys.argv[2])).tolist()]))
"""


def step_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rbln-retrieval-step"]


def test_the_default_engine_runs_vllm_in_this_process_on_the_bundled_backend(minilm_engine):
    from vllm.platforms import current_platform

    assert isinstance(minilm_engine._vllm, InprocEngine)
    # The worker lives in this process (other tests' in_process=False engines may have processes of their own).
    assert type(minilm_engine._vllm._engine.model_executor).__name__ == "UniProcExecutor"
    assert isinstance(current_platform, BundledPlatform)
    builders = minilm_engine.stats()["attention_builders"]
    assert builders == ["EncoderOnlyAttentionBuilder(PackedAttentionMetadataBuilder)"]
    # The engine tokenizes texts itself: vLLM loads no second tokenizer at the start.
    assert minilm_engine._vllm._engine.renderer.tokenizer is None


@pytest.mark.parametrize("fixture", ["minilm_engine", "minilm_bf16_engine"])
def test_stats_name_the_host_attention_and_its_blocks_admit_vllms_amx_kernel(request, fixture):
    """Issue #35: on AVX-512 CPUs the host attends through vLLM's CPU kernel with the ISA vLLM picks for this CPU,
    and the engine's KV block size is one for which vLLM picks ``amx`` for bfloat16 on an AMX CPU; AVX2 CPUs keep
    torch's fused attention per prompt."""
    from unittest import mock

    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from rbln_retrieval import cpu_features

    engine = request.getfixturevalue(fixture)
    (attention,) = engine.stats()["attention"]
    if not cpu_features.avx512():
        assert attention == "torch's fused attention per prompt"
        return
    kernel = re.fullmatch(r"vLLM's CPU kernel, (\w+) ISA, KV blocks of (\d+)", attention)
    assert kernel, attention
    isa, block = kernel[1], int(kernel[2])
    assert isa == _get_attn_isa(getattr(torch, engine.dtype), block, 32)  # MiniLM's heads are 32 wide
    with mock.patch.object(torch.cpu, "_is_amx_tile_supported", return_value=True):
        assert _get_attn_isa(torch.bfloat16, block, 32) == "amx"


def test_an_in_process_engine_started_after_vllm_was_imported_gives_the_same_vectors(minilm, minilm_engine):
    texts = mixed_length(6)
    # A program that imports vLLM itself first names vLLM's plugins, as it must where vllm-rbln is installed
    # (a bare import resolves vllm-rbln's platform, which needs rebel-compiler); the suite's own process sets none.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "VLLM_PLUGINS": ""}
    done = subprocess.run(
        [sys.executable, "-c", VLLM_FIRST, str(minilm), json.dumps(texts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kind, vectors = json.loads(done.stdout.strip().splitlines()[-1])
    assert kind == "InprocEngine"
    vectors = np.array(vectors)
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(vectors, minilm_engine.embed(texts), atol=1e-5)


def test_the_driver_sleeps_while_the_engine_is_idle(minilm_engine):
    minilm_engine.embed(["wake the engine up"])
    cpu = time.process_time()
    time.sleep(2.0)
    busy = time.process_time() - cpu
    assert busy < 0.2, f"the idle process used {busy:.2f} s of CPU in 2 s"
    assert minilm_engine._vllm.get_num_unfinished_requests() == 0


def test_close_ends_the_step_thread_and_frees_the_engine_with_one_collection(tiny_models, monkeypatch):
    """vLLM's teardown would run three full garbage collections (seconds in a large process); close runs one."""
    before = len(step_threads())
    engine = PoolingEngine(tiny_models["bert-cls"], device="cpu", dtype="float32")
    assert len(step_threads()) == before + 1
    assert engine.embed(["one", "two"]).shape == (2, engine.dimension)
    collections = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(args) or collect(*args))
    engine.close()
    monkeypatch.undo()
    assert len(collections) == 1, collections
    deadline = time.monotonic() + 30
    while len(step_threads()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(step_threads()) == before
    assert engine._vllm is None


def test_two_in_process_engines_computing_at_once_give_their_own_results(minilm_engine, tiny_models):
    texts = mixed_length(48)
    with PoolingEngine(tiny_models["roberta-mean"], device="cpu", dtype="float32") as other:
        expected = {"minilm": minilm_engine.embed(texts), "other": other.embed(texts)}
        results: dict[str, list[np.ndarray | BaseException]] = {"minilm": [], "other": []}

        def hammer(name: str, engine: PoolingEngine) -> None:
            for _ in range(4):
                try:
                    results[name].append(engine.embed(texts))
                except BaseException as exc:  # checked below
                    results[name].append(exc)

        threads = [
            threading.Thread(target=hammer, args=item, daemon=True)
            for item in (("minilm", minilm_engine), ("other", other))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
    for name, got in results.items():
        assert len(got) == 4, name
        for vectors in got:
            assert isinstance(vectors, np.ndarray), f"{name}: {vectors!r}"
            np.testing.assert_allclose(vectors, expected[name], atol=1e-5)


def test_closing_one_in_process_engine_leaves_the_others_working(minilm_engine, tiny_models):
    """vLLM's engine shutdown destroys the process's torch.distributed groups, which every in-process engine
    steps through: only the last engine's close may tear them down."""
    texts = mixed_length(8)
    expected = minilm_engine.embed(texts)
    other = PoolingEngine(tiny_models["bert-cls"], device="cpu", dtype="float32")
    other.embed(["one"])
    other.close()
    np.testing.assert_allclose(minilm_engine.embed(texts), expected, atol=1e-5)
