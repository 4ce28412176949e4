"""Per-model limits: a config entry's limit keys (the names of serve's flags) tighten the server's bounds for that
model only. The bookkeeping of a model's Gate (slots and queued tokens taken and given back, refusals naming the
model), the entries' keys and their refusals, and the app in process (httpx's ASGI transport over the session's
tiny engine under two names): a model at its bound answers 429 naming it while the other model keeps answering."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from rbln_retrieval.server.app import build_app
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.config import model_entry
from rbln_retrieval.server.limits import MODEL_LIMITS, Gate, Limits
from rbln_retrieval.server.served import Served, ServedModels

UNBOUNDED = Limits(**dict.fromkeys(MODEL_LIMITS))


def _body(texts: list[str], model: str = "slow") -> bytes:
    return json.dumps({"model": model, "input": texts}).encode()


# -- a model's gate ------------------------------------------------------------------------------------------------
def test_a_gate_takes_a_slot_and_the_tokens_and_gives_both_back():
    gate = Gate("slow", UNBOUNDED)
    tokens = [gate.admit("/v1/embeddings", _body(["x" * 400])) for _ in range(3)]
    assert gate.in_flight == 3 and gate.queued_tokens == sum(tokens) and tokens[0] >= 100
    for taken in tokens:
        gate.release(taken)
    assert (gate.in_flight, gate.queued_tokens) == (0, 0)


def test_past_its_slots_or_tokens_a_model_is_busy_naming_it_and_its_bound():
    gate = Gate("slow", Limits(max_concurrent_requests=1, max_queued_tokens=None))
    taken = gate.admit("/v1/embeddings", _body(["a"]))
    with pytest.raises(Refused) as busy:
        gate.admit("/v1/embeddings", _body(["b"]))
    assert busy.value.kind == "overloaded"
    assert busy.value.message == (
        "The model slow is busy (1 requests in flight, its max_concurrent_requests of 1); retry after 1 s."
    )
    gate.release(taken)
    gate.release(gate.admit("/v1/embeddings", _body(["b"])))  # its slot is back
    tokens = Gate("slow", Limits(max_queued_tokens=60))
    held = tokens.admit("/v1/embeddings", _body(["x" * 100]))
    with pytest.raises(Refused, match=r"^The model slow is busy \(\d+ tokens queued, near its max_queued_tokens of 60"):
        tokens.admit("/v1/embeddings", _body(["x" * 100]))
    assert (tokens.in_flight, tokens.queued_tokens) == (1, held), "a refused request holds nothing"


@pytest.mark.parametrize(
    ("limits", "body", "sentence"),
    [
        (
            Limits(max_inputs_per_request=2),
            _body(["a", "b", "c"]),
            "The request has 3 items in `input`, over the model slow's max_inputs_per_request of 2; split it into "
            "smaller requests.",
        ),
        (
            Limits(max_input_chars=5),
            _body(["abcdef"]),
            "`input[0]` is 6 characters, over the model slow's max_input_chars",
        ),
        (Limits(max_payload_bytes=20), _body(["abcdef"]), "bytes, over the model slow's max_payload_bytes of 20"),
        (Limits(max_queued_tokens=2), _body(["abcdef"]), "over the model slow's max_queued_tokens of 2"),
    ],
)
def test_a_request_over_a_models_size_bounds_is_413_naming_the_model_and_the_limit(limits, body, sentence):
    gate = Gate("slow", limits)
    with pytest.raises(Refused) as refused:
        gate.admit("/v1/embeddings", body)
    assert refused.value.kind == "too_large" and sentence in refused.value.message
    assert (gate.in_flight, gate.queued_tokens) == (0, 0)


# -- the entries' keys ---------------------------------------------------------------------------------------------
def test_an_entry_sets_the_limits_by_serves_flag_names_and_they_tighten_the_servers():
    entry = model_entry({"model": "m", "max_concurrent_requests": 2, "max_input_chars": 100, "max_length": 64})
    assert entry.limits == {"max_concurrent_requests": 2, "max_input_chars": 100}
    assert entry.options({}) == {"max_length": 64}, "limits are not engine options"
    server = Limits(max_concurrent_requests=8)
    own = server.tightened(entry.limits, "m")
    assert (own.max_concurrent_requests, own.max_input_chars, own.max_queued_tokens) == (2, 100, 1_000_000)
    assert server.tightened({}, "m") == server


@pytest.mark.parametrize(
    ("entry", "sentence"),
    [
        (
            {"max_queued_tokens": 0},
            "the model: max_queued_tokens=0 is refused: Input should be greater than or equal to 1.",
        ),
        ({"upload_seconds": 5}, "the model: upload_seconds is not an option of a served model (those are: "),
        ({"limits": {"max_queued_tokens": 5}}, "the model: limits is not an option of a served model (those are: "),
    ],
)
def test_an_entrys_bad_limit_is_refused_in_one_sentence(entry, sentence):
    with pytest.raises(ValueError) as error:
        model_entry({"model": "m", **entry})
    assert str(error.value).startswith(sentence) and "\n" not in str(error.value)
    assert "max_concurrent_requests" in str(error.value) or "=0" in str(error.value)


def test_a_models_limit_looser_than_the_servers_is_refused_naming_both():
    with pytest.raises(ValueError) as error:
        Limits(max_concurrent_requests=4).tightened({"max_concurrent_requests": 16}, "BAAI/bge-reranker-base")
    assert str(error.value) == (
        "BAAI/bge-reranker-base: max_concurrent_requests=16 is over the server's max_concurrent_requests of 4; "
        "a model's limit can only tighten the server's."
    )


# -- the app: one model at its bound, the other answering ----------------------------------------------------------
class Held:
    """The tiny engine, its embeddings held until ``release`` is set (a model whose requests stay in flight)."""

    def __init__(self, engine):
        self._engine = engine
        self.arrived = asyncio.Semaphore(0)
        self.release = asyncio.Event()

    def __getattr__(self, name):
        return getattr(self._engine, name)

    async def aembed(self, *args, **kwargs):
        self.arrived.release()
        await self.release.wait()
        return await self._engine.aembed(*args, **kwargs)


async def test_a_model_at_its_bound_answers_429_naming_it_while_the_other_model_answers(tiny_engine):
    server = Limits()
    slow, fast = Held(tiny_engine), tiny_engine
    own = server.tightened({"max_concurrent_requests": 1}, "slow")
    models = ServedModels(
        [
            Served("slow", slow, {"model": "slow", "limits": own.advertised()}, Gate("slow", own)),
            Served("fast", fast, {"model": "fast", "limits": server.advertised()}),
        ]
    )
    app = build_app(models, limits=server)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=120) as client:
        held = asyncio.create_task(client.post("/v1/embeddings", json={"model": "slow", "input": ["a"]}))
        await slow.arrived.acquire()  # the first request holds the slow model's one slot
        try:
            # Answered at once, not held behind the first (a deadline only: a request admitted past the bound
            # would wait on the held one forever).
            async with asyncio.timeout(60):
                busy = await client.post("/v1/embeddings", json={"model": "slow", "input": ["b"]})
                answered = await client.post("/v1/embeddings", json={"model": "fast", "input": ["b"]})
        finally:
            slow.release.set()
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["message"] == (
            "The model slow is busy (1 requests in flight, its max_concurrent_requests of 1); retry after 1 s."
        )
        assert answered.status_code == 200, answered.text
        assert (await held).status_code == 200
        again = await client.post("/v1/embeddings", json={"model": "slow", "input": ["c"]})
        assert again.status_code == 200, "the slot is given back once its request is answered"
    assert (models["slow"].gate.in_flight, models["slow"].gate.queued_tokens) == (0, 0)
