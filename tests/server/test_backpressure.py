"""Backpressure without a model: the ASGI middleware in front of a stand-in app (429 + Retry-After, 413 naming the
limit), the client's waits on 429 against a fake server, and its batches cut under advertised limits.
tests/server/test_serving.py runs the same against a real server."""

from __future__ import annotations

import asyncio
import json
import types

import pytest
from http_fakes import FakeServer

from rbln_retrieval.remote import RemoteEngine, RemoteError
from rbln_retrieval.remote import replicas as replicas_module
from rbln_retrieval.remote.replicas import Replicas
from rbln_retrieval.remote.served_model import RemoteModel
from rbln_retrieval.server.limits import Backpressure, Limits


class App:
    """An ASGI app that holds every POST until ``release`` is set and answers 200 with the body it received."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0
        self.arrived = asyncio.Semaphore(0)  # one release per request that reached the app

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        self.arrived.release()
        message = await receive()
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": message["body"]})


async def request(
    app, body: bytes, *, method="POST", chunks: int = 1, declare: bool = True, path="/v1/embeddings", receive=None
):
    """(status, headers, body) of one request to ``path`` of ``app``, its body sent in ``chunks`` pieces (or as
    ``receive`` gives it)."""
    headers = [(b"content-length", str(len(body)).encode())] if declare else []
    scope = {"type": "http", "method": method, "path": path, "headers": headers}
    step = max(1, -(-len(body) // chunks))
    pieces = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    sent: list[dict] = []

    async def pieces_then_disconnect():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    receive = receive or pieces_then_disconnect

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body_out


async def test_past_max_concurrent_requests_the_server_answers_429_with_retry_after_then_serves_again():
    inner = App()
    app = Backpressure(inner, Limits(max_concurrent_requests=2, max_queued_tokens=None, max_payload_bytes=None))
    held = [asyncio.create_task(request(app, b'{"input": "a"}')) for _ in range(2)]
    for _ in held:  # both hold a slot: they reached the app
        await inner.arrived.acquire()
    status, headers, body = await request(app, b'{"input": "b"}')
    assert status == 429 and headers[b"retry-after"] == b"1"
    assert "max_concurrent_requests of 2" in json.loads(body)["error"]["message"]
    assert inner.calls == 2  # the refused request never reached the app
    inner.release.set()
    assert [status for status, _, _ in await asyncio.gather(*held)] == [200, 200]
    assert app.in_flight == 0 and app.queued_tokens == 0
    assert (await request(app, b'{"input": "c"}'))[0] == 200


async def test_queued_tokens_are_bounded_and_a_request_over_the_whole_budget_is_413():
    inner = App()
    app = Backpressure(inner, Limits(max_concurrent_requests=None, max_queued_tokens=100, max_payload_bytes=None))
    held = asyncio.create_task(request(app, b"x" * 300))  # 75 tokens queued
    await inner.arrived.acquire()
    status, headers, body = await request(app, b"y" * 200)  # 50 more: over 100
    assert status == 429 and b"retry-after" in headers and b"max_queued_tokens of 100" in body
    status, _, body = await request(app, b"z" * 404)  # 101 tokens alone: never fits
    assert status == 413 and b"max_queued_tokens of 100" in body
    inner.release.set()
    assert (await held)[0] == 200


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "chunked"])
async def test_a_body_over_max_payload_bytes_is_413_naming_the_limit(declare):
    inner = App()
    inner.release.set()
    app = Backpressure(inner, Limits(max_payload_bytes=1000))
    status, _, body = await request(app, b"x" * 1001, chunks=4, declare=declare)
    assert status == 413 and inner.calls == 0
    message = json.loads(body)["error"]["message"]
    assert message.startswith("The request body is") and "max_payload_bytes of 1000" in message
    status, _, body = await request(app, b"x" * 1000, chunks=4, declare=declare)
    assert status == 200 and body == b"x" * 1000  # replayed whole to the app


async def test_a_request_holds_its_slot_while_its_body_arrives_so_slow_uploads_cannot_pile_up():
    inner = App()
    inner.release.set()
    app = Backpressure(inner, Limits(max_concurrent_requests=1))
    first_piece_read, rest_sent = asyncio.Event(), asyncio.Event()

    async def slow_upload():
        if not first_piece_read.is_set():
            first_piece_read.set()
            return {"type": "http.request", "body": b'{"input": ', "more_body": True}
        await rest_sent.wait()
        return {"type": "http.request", "body": b'"a"}', "more_body": False}

    slow = asyncio.create_task(request(app, b'{"input": "a"}', receive=slow_upload))
    await first_piece_read.wait()
    status, headers, body = await request(app, b'{"input": "b"}')
    assert status == 429 and b"retry-after" in headers
    assert "1 requests in flight, the max_concurrent_requests of 1" in json.loads(body)["error"]["message"]
    assert inner.calls == 0
    rest_sent.set()
    assert (await slow)[0] == 200 and app.in_flight == 0


async def test_a_client_gone_while_uploading_frees_its_slot():
    inner = App()
    app = Backpressure(inner, Limits(max_concurrent_requests=1))
    pieces = [{"type": "http.request", "body": b'{"in', "more_body": True}, {"type": "http.disconnect"}]

    async def gone():
        return pieces.pop(0)

    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}
    await app(scope, gone, None)  # nothing is sent to a client that left
    assert app.in_flight == 0 and inner.calls == 0


QUERY = "w " * 500  # 1000 bytes: 250 tokens, counted once per document by vLLM's pair tokenization
DOCUMENTS = ["a document"] * 10


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/score", ("queries", "documents")),
        ("/score", ("queries", "items")),
        ("/score", ("data_1", "data_2")),
        ("/v1/score", ("text_1", "text_2")),
        ("/rerank", ("query", "documents")),
        ("/v1/rerank", ("query", "documents")),
        ("/v2/rerank", ("query", "documents")),
        ("/invocations", ("query", "documents")),
    ],
)
async def test_a_scoring_request_costs_its_query_once_per_document(path, fields):
    """Its body (about 1,100 bytes: 275 tokens by bytes) passes a 1,000-token budget; the pairs vLLM tokenizes
    (10 x the 1,000-byte query, plus the documents) do not: 413 naming the limit, its value and the count."""
    inner = App()
    inner.release.set()
    app = Backpressure(inner, Limits(max_queued_tokens=1000))
    body = json.dumps({"model": "m", fields[0]: QUERY, fields[1]: DOCUMENTS}).encode()
    assert len(body) / 4 < 1000
    status, _, answer = await request(app, body, path=path)
    assert status == 413 and inner.calls == 0
    assert json.loads(answer)["error"]["message"] == (
        f"The request costs about 2525 tokens to tokenize (the 1000-byte {fields[0]} counted with each of the 10 "
        f"{fields[1]}), over the server's max_queued_tokens of 1000; split it into smaller requests."
    )
    few = json.dumps({"model": "m", fields[0]: QUERY, fields[1]: DOCUMENTS[:3]}).encode()
    assert (await request(app, few, path=path))[0] == 200


@pytest.mark.parametrize(
    ("path", "request_body", "message"),
    [
        (
            "/v1/embeddings",
            {"input": ["a"] * 500_000},
            "The request has 500000 items in `input`, over the server's max_inputs_per_request of 2048; split it "
            "into smaller requests.",
        ),
        (
            "/rerank",
            {"query": "q", "documents": ["d"] * 2049},
            "The request has 2049 items in `documents`, over the server's max_inputs_per_request of 2048; split it "
            "into smaller requests.",
        ),
        (
            "/rerank",
            {"query": "q", "documents": ["d", "x" * 262_145]},
            "`documents[1]` is 262145 characters, over the server's max_input_chars of 262144; shorten it (only the "
            "model's max length in tokens is kept of it) or split it.",
        ),
        (
            "/v1/embeddings",
            {"input": "y" * 300_000},
            "`input` is 300000 characters, over the server's max_input_chars of 262144; shorten it (only the "
            "model's max length in tokens is kept of it) or split it.",
        ),
    ],
    ids=["embeddings-inputs", "rerank-documents", "rerank-document-chars", "embeddings-chars"],
)
async def test_inputs_and_characters_past_the_limits_are_413_naming_limit_value_and_item(path, request_body, message):
    inner = App()
    inner.release.set()
    app = Backpressure(inner, Limits(max_payload_bytes=None, max_queued_tokens=None))
    status, _, answer = await request(app, json.dumps(request_body).encode(), path=path)
    assert (status, json.loads(answer)["error"]["message"]) == (413, message) and inner.calls == 0


async def test_gets_are_never_bounded():
    inner = App()
    inner.release.set()
    app = Backpressure(inner, Limits(max_concurrent_requests=1, max_payload_bytes=1))
    app.in_flight = 1
    assert (await request(app, b"", method="GET"))[0] == 200


@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_limits_refuse_what_is_not_a_positive_integer(bad):
    with pytest.raises(ValueError, match=rf"max_payload_bytes={bad!r} must be a positive integer or None"):
        Limits(max_payload_bytes=bad)


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    """Every wait the client asks for (its asyncio.sleep), recorded, then waited."""
    asked: list[float] = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        await real_sleep(seconds)

    real_sleep = asyncio.sleep
    monkeypatch.setattr(replicas_module, "asyncio", types.SimpleNamespace(sleep=sleep, Semaphore=asyncio.Semaphore))
    return asked


async def test_the_client_waits_out_429_as_retry_after_says_and_it_costs_no_attempt(waits):
    with FakeServer("busy", busy_posts=3, retry_after="0.3") as server:
        replicas = Replicas([server.url], api_key=None, timeout=10, max_retries=0)
        assert await replicas.post("/v1/embeddings", {"input": []}) == {"data": []}
        await replicas.aclose()
    assert len(server.posts) == 4 and replicas.throttled == 3
    assert len(waits) == 3 and all(0.3 <= wait <= 0.3 * 1.25 for wait in waits), waits  # Retry-After, jittered
    assert all(gap >= 0.3 for gap in server.gaps()), server.gaps()


async def test_a_server_busy_past_the_timeout_is_one_error_within_it(waits):
    with FakeServer("busy", busy_posts=10**6, retry_after="") as server:  # no Retry-After: 1 s by default
        replicas = Replicas([server.url], api_key=None, timeout=2.5, max_retries=3)
        with pytest.raises(RemoteError, match=r"stayed busy \(HTTP 429\) past the call's timeout of 2.5 s"):
            await replicas.post("/v1/embeddings", {"input": []})
        await replicas.aclose()
    # Each wait is the default second, jittered; the client stops before a wait would pass the call's timeout.
    assert all(1.0 <= wait <= 1.25 for wait in waits) and sum(waits) <= 2.5, waits
    assert len(server.posts) == len(waits) + 1 and 1 <= len(waits) <= 2, (waits, len(server.posts))


def test_batches_stay_under_the_advertised_limits_in_order_each_input_once():
    remote = RemoteModel("m", None, None, {})  # type: ignore[arg-type]
    items = [f"text {i} " + "é" * (i % 50) for i in range(500)]
    assert remote.batches(items, 64) == [items[i : i + 64] for i in range(0, 500, 64)]  # no limits known
    remote.limits = {"max_payload_bytes": 6000, "max_queued_tokens": 10**6}
    batches = remote.batches(items, 64, reserve=100)
    assert [item for batch in batches for item in batch] == items
    assert all(len(json.dumps(b)) + 100 + 4096 <= 6000 and len(b) <= 64 for b in batches) and len(batches) > 8
    remote.limits = {"max_payload_bytes": None, "max_queued_tokens": 1100}  # 4400 bytes
    with pytest.raises(ValueError, match=r"^Input 1 is 5004 bytes as the server counts it, over the 304 bytes"):
        remote.batches(["short", "x" * 5000], 64)


def test_the_client_asks_for_base64_float32(minilm):
    """The compact transport is asked for (the real-server tests prove it decodes to local's vectors)."""
    with FakeServer("sleep") as server, RemoteEngine(minilm, base_url=server.url, max_retries=0) as remote:
        with pytest.raises(RemoteError, match="answered 0 results for 1 inputs, so its answer is refused"):
            remote.embed(["a"])
    wanted = {"encoding_format": "base64", "embed_dtype": "float32", "endianness": "little"}
    assert server.bodies[0].items() >= wanted.items()
