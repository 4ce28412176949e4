"""Serving under real traffic, against one real server: vLLM's own options passed through (TLS, uvicorn's log
level, request logging, request-id headers), backpressure under a load of 512 concurrent clients on a stalled
engine (exactly the bound admitted, 429 or 413 for the rest at once, never 5xx, never a hang), RemoteEngine under
the same bound (every result once, in order, equal to local), and /health answering 503 once the engine is dead
(the last test: it kills the engine). Load is made by stopping the engine (SIGSTOP), never by timing."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import signal
import time

import httpx
import numpy as np
import psutil
import pytest
from corpus import mixed_length
from servers import Server

from rbln_retrieval.engines.protocol import DESCRIBE_PATH
from rbln_retrieval.remote import RemoteEngine
from rbln_retrieval.server.limits import Limits

pytestmark = pytest.mark.server

LIMITS = {"max_concurrent_requests": 8, "max_queued_tokens": 40_000, "max_payload_bytes": 32_000}
VLLM_ARGS = ["--uvicorn-log-level", "warning", "--enable-log-requests", "--enable-request-id-headers"]
CLIENTS = 512


def self_signed(directory) -> tuple:
    """A certificate for 127.0.0.1 and its key, as PEM files in ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def bounded(minilm, tmp_path_factory):
    """MiniLM over TLS with small limits and a few of vLLM's own options; vLLM logs at INFO so its request log
    shows."""
    directory = tmp_path_factory.mktemp("serving")
    server = Server(
        minilm,
        directory / "server.log",
        # The flood's clients connect first; on a loaded machine vLLM's 5 s keep-alive would close the early
        # connections before the flood reaches them.
        env={"VLLM_LOGGING_LEVEL": "INFO", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "900"},
        options={"dtype": "float32", "limits": LIMITS, "vllm_args": VLLM_ARGS},
        tls=self_signed(directory),
    )
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _body(minilm, text: str) -> dict:
    return {"model": str(minilm), "input": [text]}


def test_the_server_honours_vllms_own_options(bounded, minilm):
    assert bounded.url.startswith("https://")
    with pytest.raises(httpx.ConnectError):  # TLS: a client that does not trust the certificate is refused
        httpx.get(bounded.url + "/health")
    response = httpx.post(bounded.url + "/v1/embeddings", json=_body(minilm, "hello"), verify=bounded.verify)
    assert response.status_code == 200 and response.headers.get("x-request-id")  # --enable-request-id-headers
    log = bounded.log.read_text()
    assert "Added request" in log  # --enable-log-requests
    # --uvicorn-log-level warning: none of uvicorn's INFO lines (its start banner, the access log).
    assert "Uvicorn running on" not in log and "Started server process" not in log
    assert '"POST /v1/embeddings HTTP/1.1" 200' not in log
    described = httpx.get(bounded.url + DESCRIBE_PATH, verify=bounded.verify).json()
    assert described["limits"] == {**Limits().advertised(), **LIMITS}


def _client(verify, clients: int = CLIENTS) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    return httpx.AsyncClient(verify=verify, limits=limits, timeout=900)


async def _post(client, url: str, minilm, text: str) -> tuple:
    """(status, retry-after, body) of one embedding request."""
    response = await client.post(url + "/v1/embeddings", json=_body(minilm, text))
    return response.status_code, response.headers.get("retry-after"), response.json()


async def test_512_concurrent_clients_get_200_429_or_413_never_5xx_or_a_hang(bounded, minilm):
    """With the engine stalled (so no request can finish and free its slot), the server admits exactly
    max_concurrent_requests of 512 concurrent clients and answers every other one while the admitted ones wait: 429
    with Retry-After, or 413 past the payload bound. Once the engine continues, the admitted ones get their vectors."""
    admitted = LIMITS["max_concurrent_requests"]
    oversize = CLIENTS // 32
    answered: list[tuple] = []
    refused = asyncio.Event()

    async def one(client, i: int) -> tuple:
        text = "x " * LIMITS["max_payload_bytes"] if i % 32 == 31 else f"request {i}"
        answered.append(answer := await _post(client, bounded.url, minilm, text))
        if len(answered) == CLIENTS - admitted:
            refused.set()
        return answer

    async with _client(bounded.verify) as client:
        # 512 clients connect first (TLS handshakes: seconds on 2 cores), so the flood meets the bounds alone.
        health = await asyncio.gather(*(client.get(bounded.url + "/health") for _ in range(CLIENTS)))
        assert {r.status_code for r in health} == {200}
        with bounded.stalled():
            flood = asyncio.gather(*(one(client, i) for i in range(CLIENTS)))
            await asyncio.wait_for(refused.wait(), timeout=900)  # every request but the admitted ones answered
            assert {status for status, *_ in answered} <= {429, 413}, "a request finished on a stalled engine"
        answers = await asyncio.wait_for(flood, timeout=900)
    statuses = [status for status, *_ in answers]
    assert len(answers) == CLIENTS and set(statuses) <= {200, 429, 413}
    assert (statuses.count(200), statuses.count(413)) == (admitted, oversize)
    assert statuses.count(429) == CLIENTS - admitted - oversize
    for status, retry_after, body in answers:
        if status == 200:
            assert len(body["data"]) == 1 and len(body["data"][0]["embedding"]) == 384
        elif status == 429:
            assert (
                retry_after == "1"
                and "8 requests in flight, the max_concurrent_requests of 8" in body["error"]["message"]
            )
        else:
            assert "max_payload_bytes of 32000" in body["error"]["message"]


async def test_remote_engine_under_the_same_bound_gets_every_result_once_in_order_equal_to_local(
    bounded, minilm, minilm_engine
):
    """RemoteEngine's batches meet 429s (other clients hold every slot of the server) and a payload bound a 64-text
    batch would break: it waits them out and splits, and the result equals local mode's.

    The slots are held deterministically: with the engine stalled, nine requests arrive, eight are admitted and
    hold their slots, the ninth is refused; the call starts then, and the engine continues once the server has
    refused the call."""
    texts = mixed_length(600)
    batches = [json.dumps(texts[i : i + 64]) for i in range(0, len(texts), 64)]
    assert max(map(len, batches)) > LIMITS["max_payload_bytes"]  # a 64-text batch must be split to pass
    slots = LIMITS["max_concurrent_requests"]
    remote = RemoteEngine(minilm, base_url=bounded.url, verify=bounded.verify, timeout=900)
    replicas = remote._replicas

    async def refused_once() -> None:
        while replicas.throttled == 0:
            await asyncio.sleep(0.01)

    try:
        async with _client(bounded.verify, 16) as client:
            with bounded.stalled():
                holders = [
                    asyncio.create_task(_post(client, bounded.url, minilm, f"holder {i}")) for i in range(slots + 1)
                ]
                done, _ = await asyncio.wait(holders, timeout=900, return_when=asyncio.FIRST_COMPLETED)
                assert [task.result()[0] for task in done] == [429], "the ninth request must be the one refused"
                call = asyncio.create_task(remote.aembed(texts))
                await asyncio.wait_for(refused_once(), timeout=900)
            vectors = await asyncio.wait_for(call, timeout=900)
            assert sorted([(await holder)[0] for holder in holders]) == [200] * slots + [429]
        np.testing.assert_allclose(vectors, minilm_engine.embed(texts), atol=1e-5)
        assert vectors.shape == (600, 384) and replicas.throttled > 0
    finally:
        remote.close()


def test_health_answers_503_once_the_engine_is_dead(bounded):
    """vLLM's own /health: 200 while the engine runs, 503 once the engine-core process has died. vLLM's watchdog
    (every 5 s, unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1) then stops the server, so a poll can miss the 503 window
    and find the server gone (seen in CI): refused connections count only once the server process has exited."""
    assert httpx.get(bounded.url + "/health", verify=bounded.verify).status_code == 200
    engine_cores = psutil.Process(bounded.process.pid).children(recursive=True)
    assert engine_cores, "the server has no engine-core process"
    for child in engine_cores:
        os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 300
    seen = []
    while time.monotonic() < deadline and 503 not in seen:
        try:
            seen.append(httpx.get(bounded.url + "/health", verify=bounded.verify, timeout=10).status_code)
        except httpx.ConnectError:
            bounded.process.wait(timeout=300)  # refused: the server must have exited on its own
            seen.append("exited")
            break
        assert seen[-1] in (200, 503), seen
        time.sleep(0.1)
    assert seen[-1] in (503, "exited"), f"/health still answered 200 300 s after the engine died: {seen[-5:]}"
