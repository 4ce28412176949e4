"""Serving under real traffic, against one real server: vLLM's own options passed through (TLS, uvicorn's log
level, request logging, request-id headers), backpressure under a load of 512 concurrent clients (200, 429 or 413,
never 5xx, never a hang), RemoteEngine under the same bound (every result once, in order, equal to local), and
/health answering 503 once the engine is dead (the last test: it kills the engine)."""

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
        env={"VLLM_LOGGING_LEVEL": "INFO"},
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
    return httpx.AsyncClient(verify=verify, limits=limits, timeout=60)


async def _flood(client, url: str, minilm, clients: int = CLIENTS, oversize_every: int = 32) -> list[tuple]:
    """(status, retry-after, seconds, body) of ``clients`` concurrent requests, every ``oversize_every``-th over
    max_payload_bytes; bounded: each request 60 s, all of them 120 s."""

    async def one(i: int) -> tuple:
        text = "x " * LIMITS["max_payload_bytes"] if i % oversize_every == oversize_every - 1 else f"request {i}"
        started = time.perf_counter()
        response = await client.post(url + "/v1/embeddings", json=_body(minilm, text))
        seconds = time.perf_counter() - started
        return response.status_code, response.headers.get("retry-after"), seconds, response.json()

    return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(clients))), timeout=120)


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[max(0, round(share * len(ordered)) - 1)], 1) if ordered else 0.0


async def test_512_concurrent_clients_get_200_429_or_413_never_5xx_or_a_hang(bounded, minilm):
    async with _client(bounded.verify) as client:
        # 512 clients connect first (TLS handshakes: seconds on 2 cores), so the figures are the serving's own.
        handshakes = time.perf_counter()
        health = await asyncio.gather(*(client.get(bounded.url + "/health") for _ in range(CLIENTS)))
        handshakes = time.perf_counter() - handshakes
        assert {r.status_code for r in health} == {200}
        started = time.perf_counter()
        answers = await _flood(client, bounded.url, minilm)
        elapsed = time.perf_counter() - started
    statuses = [status for status, *_ in answers]
    assert set(statuses) <= {200, 429, 413} and len(answers) == CLIENTS
    assert statuses.count(200) >= LIMITS["max_concurrent_requests"] and statuses.count(429) > 0
    for status, retry_after, _, body in answers:
        if status == 200:
            assert len(body["data"]) == 1 and len(body["data"][0]["embedding"]) == 384
        elif status == 429:
            assert retry_after == "1" and "max_concurrent_requests of 8" in body["error"]["message"]
        else:
            assert status == 413 and "max_payload_bytes of 32000" in body["error"]["message"]
    assert statuses.count(413) == CLIENTS // 32
    latencies = {code: [s for status, _, s, _ in answers if status == code] for code in (200, 429, 413)}
    every = [s for *_, s, _ in answers]
    figures = {
        "requests_per_s": round(CLIENTS / elapsed),
        "p50_ms": _percentile(every, 0.5),
        "p99_ms": _percentile(every, 0.99),
        **{f"p50_ms_{code}": _percentile(values, 0.5) for code, values in latencies.items()},
        "share_429": round(statuses.count(429) / CLIENTS, 3),
        "share_200": round(statuses.count(200) / CLIENTS, 3),
        "connect_512_tls_s": round(handshakes, 1),
    }
    print(f"\nload: {CLIENTS} concurrent clients, limits {LIMITS}, TLS, {os.cpu_count()} cores: {json.dumps(figures)}")
    # Past the bound the server answers at once: nobody waits behind a queue it cannot serve.
    assert figures["p99_ms"] < 30_000


async def test_remote_engine_under_the_same_bound_gets_every_result_once_in_order_equal_to_local(
    bounded, minilm, minilm_engine
):
    """RemoteEngine's batches meet 429s (other clients hold the server's slots) and a payload bound a 64-text batch
    would break: it waits them out and splits, and the result equals local mode's.

    The call starts only once the server refuses a probe, while slow requests hold every slot: waves of short
    requests alone leave the slots free between waves, and a call that slipped through them proved nothing."""
    texts = mixed_length(600)
    batches = [json.dumps(texts[i : i + 64]) for i in range(0, len(texts), 64)]
    assert max(map(len, batches)) > LIMITS["max_payload_bytes"]  # a 64-text batch must be split to pass
    remote = RemoteEngine(minilm, base_url=bounded.url, verify=bounded.verify, timeout=120)
    done = asyncio.Event()

    async def hold_every_slot(client: httpx.AsyncClient) -> list[asyncio.Task]:
        # Slow requests of 16 ~200-token texts (4,000 estimated tokens; 8 fit under max_queued_tokens) are seconds of
        # work for the engine together. Any that lost its slot (to the probe, say) or ended is replaced until a probe
        # is refused, so the call starts while every slot is held.
        slow = {"model": str(minilm), "input": ["word " * 200] * 16}
        holders: list[asyncio.Task] = []
        for _ in range(50):
            live = sum(not holder.done() for holder in holders)
            holders += [
                asyncio.create_task(client.post(bounded.url + "/v1/embeddings", json=slow))
                for _ in range(LIMITS["max_concurrent_requests"] - live)
            ]
            await asyncio.sleep(0.2)  # the holders reach the server before the probe does
            probe = await client.post(bounded.url + "/v1/embeddings", json=_body(minilm, "probe"))
            if probe.status_code == 429:
                return holders
        raise AssertionError("slow requests never filled the server's slots")

    async def other_clients() -> int:
        waves = 0
        async with _client(bounded.verify, 64) as client:
            while not done.is_set() and waves < 40:  # bounded: stops with the call, or after 40 waves
                await _flood(client, bounded.url, minilm, clients=64, oversize_every=10**6)
                waves += 1
        return waves

    async def call() -> np.ndarray:
        try:
            return await remote.aembed(texts)
        finally:
            done.set()

    try:
        async with _client(bounded.verify, 16) as holding:
            holders = await hold_every_slot(holding)
            vectors, waves = await asyncio.wait_for(asyncio.gather(call(), other_clients()), timeout=300)
            assert {(await holder).status_code for holder in holders} <= {200, 429}
        np.testing.assert_allclose(vectors, minilm_engine.embed(texts), atol=1e-5)
        assert vectors.shape == (600, 384) and waves >= 1
        assert remote._replicas.throttled > 0, "the call never met the bound: the test proves nothing"
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
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline and 503 not in seen:
        try:
            seen.append(httpx.get(bounded.url + "/health", verify=bounded.verify, timeout=10).status_code)
        except httpx.ConnectError:
            bounded.process.wait(timeout=30)  # refused: the server must have exited on its own
            seen.append("exited")
            break
        assert seen[-1] in (200, 503), seen
        time.sleep(0.1)
    assert seen[-1] in (503, "exited"), f"/health still answered 200 60 s after the engine died: {seen[-5:]}"
