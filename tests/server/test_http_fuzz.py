"""The schema lane: requests generated from the OpenAPI schema each server serves (schemathesis), over every route
it mounts, with and without the API key, searching for a 5xx, a response off its schema or a connection out of the
server; then the issue's cases as plain tests (remote media URLs, a decompression bomb on every route that carries
media, a 20,000-deep body, Cohere's input types and null fields).

Outbound connections are watched three ways: a loopback listener (the trap) whose URL the generated bodies carry in
place of some strings; the watched server's HTTP proxy variables pointing at the trap, so a fetch of any other
host reaches it too (vLLM's media connector and requests honour them); and the server's process tree's sockets
(psutil), which must hold no connection but its clients'. Each case is bounded by the request's timeout and
Hypothesis' deadline, both far above any answer's time, so a hang fails and a slow machine does not. The examples
are derandomized and few, so the lane is the same on every run and costs about a minute on 2 cores.

Servers: a tiny CLIP with an API key (this module's, watched by proxy and psutil), the session's tiny cross-encoder
(`reranker_server`, psutil) and MiniLM (`minilm_server`, the model without prompts)."""

from __future__ import annotations

import base64
import datetime
import functools
import io
import re
import socket
import struct
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from multimodal_builders import build_clip, png_bytes, sample_images
from servers import PROBES, Server
from tolerances import min_row_cosine

pytestmark = pytest.mark.server

API_KEY = "fuzz-key-5be2d1"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TIMEOUT = 120.0  # seconds a request may take: far above any answer here, so only a hang reaches it
EXAMPLES = {"positive": 6, "negative": 4, "no key": 1}  # per route and server


class Trap:
    """A loopback listener that records every connection made to it (the request line, if one is sent) and
    answers 404: no test server has a reason to connect to it."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.hits: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.socket.accept()
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                try:
                    line = connection.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                    connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    line = "(no request line)"
                self.hits.append(line)

    def close(self) -> None:
        self.socket.close()


def open_connections(server: Server) -> list[str]:
    """The server's process tree's internet sockets connected anywhere but to its own listening port (a client's
    connection has the server's port on its local side)."""
    root = psutil.Process(server.process.pid)
    found = []
    for process in [root, *root.children(recursive=True)]:
        for connection in process.net_connections(kind="inet"):
            if connection.raddr and connection.laddr.port != server.port:
                found.append(f"pid {process.pid}: {connection.laddr} -> {connection.raddr} ({connection.status})")
    return found


def assert_nothing_out(server: Server, trap: Trap) -> None:
    assert not trap.hits, f"the server connected out: {trap.hits}"
    assert not open_connections(server), f"the server holds connections out: {open_connections(server)}"


@pytest.fixture(scope="module")
def trap() -> Iterator[Trap]:
    listener = Trap()
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def clip_server(trap, tmp_path_factory) -> Iterator[Server]:
    """A tiny CLIP behind an API key, every proxy variable pointing at the trap (and none bypassed)."""
    clip = build_clip(tmp_path_factory.mktemp("fuzz") / "clip")
    proxies = {name: trap.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy")}
    env = {**proxies, "all_proxy": trap.url, "NO_PROXY": "", "no_proxy": ""}
    started = Server(clip, tmp_path_factory.mktemp("fuzz-logs") / "clip.log", api_key=API_KEY, env=env)
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def served_model(server: Server, headers: dict[str, str]) -> str:
    return httpx.get(server.url + "/v1/models", headers=headers, timeout=TIMEOUT).json()["data"][0]["id"]


# -- the generated lane --------------------------------------------------------------------------------------------
def plant(value: Any, url: str, choices: st.DataObject) -> Any:
    """``value`` with some of its strings (Hypothesis' choice) replaced by ``url``, wherever they are."""
    if isinstance(value, dict):
        return {key: plant(item, url, choices) for key, item in value.items()}
    if isinstance(value, list):
        return [plant(item, url, choices) for item in value]
    if isinstance(value, str) and choices.draw(st.booleans(), label="plant"):
        return url
    return value


def refusal_sentence(response: Any) -> str:
    """The sentence of a refusal in any dialect's error body (TEI's ``error``, OpenAI's ``error.message``,
    Cohere's ``message``), or "" when the body carries none or carries a traceback or pydantic's own text."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    message = error.get("message") if isinstance(error, dict) else error or body.get("message")
    if not isinstance(message, str) or not message.strip():
        return ""
    leaks = ("Traceback", "validation error for", "errors.pydantic.dev", "decompression bomb DOS")
    return "" if any(leak in message for leak in leaks) else message


def operations(server: Server, headers: dict[str, str]) -> list[Any]:
    import schemathesis

    schema = schemathesis.openapi.from_url(server.url + "/openapi.json", headers=headers, timeout=TIMEOUT)
    found = [result.ok() for result in schema.get_all_operations()]
    assert found, "the server's schema lists no route"
    return found


def fuzz(server: Server, trap: Trap, mode: str, with_key: bool) -> list[str]:
    """Runs the generated cases of ``mode`` ("positive": bodies that fit the schema; "negative": bodies that do
    not) on every route of ``server``'s schema; returns the failures, one line each (all routes run first)."""
    failures: list[str] = []
    for operation in operations(server, HEADERS):
        run_cases(server, trap, operation, mode, with_key, failures)
    return failures


def run_cases(server: Server, trap: Trap, operation: Any, mode: str, with_key: bool, failures: list[str]) -> None:
    from schemathesis import GenerationMode
    from schemathesis.core.failures import Failure, FailureGroup
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    if mode == "negative" and not (list(operation.body) or list(operation.query)):
        return  # nothing to send that could break the schema: the positive cases cover the route
    headers = HEADERS if with_key else {}
    label = f"{operation.method.upper()} {operation.path}"
    media = [trap.url + "/x.png", data_url(bomb())]

    @settings(
        max_examples=EXAMPLES[mode if with_key else "no key"],
        deadline=datetime.timedelta(seconds=TIMEOUT + 30),
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(GenerationMode(mode)), choices=st.data())
    def one(case: Any, choices: st.DataObject) -> None:
        if isinstance(case.body, dict | list):
            case.body = plant(case.body, choices.draw(st.sampled_from(media), label="media"), choices)
        response = case.call(base_url=server.url, headers=headers, timeout=TIMEOUT)
        sent = repr(case.body)[:300]
        if response.status_code >= 500:
            failures.append(f"{label}: {response.status_code} {response.text[:300]!r} for {sent}")
        elif not with_key and operation.path not in PROBES and response.status_code != 401:
            failures.append(f"{label} without the key: {response.status_code}, not 401")
        elif with_key and response.status_code >= 400 and not refusal_sentence(response):
            failures.append(f"{label}: {response.status_code} without one sentence: {response.text[:300]!r}")
        else:
            checks = [status_code_conformance, content_type_conformance, response_schema_conformance]
            try:
                case.validate_response(response, checks=checks)
            except (Failure, FailureGroup) as failure:
                failures.append(f"{label}: {response.status_code} off its schema: {str(failure)[:400]} for {sent}")
        if trap.hits or open_connections(server):
            failures.append(f"{label}: a connection out ({trap.hits}, {open_connections(server)}) for {sent}")
            trap.hits.clear()

    one()


KEYED_RUNS = [
    pytest.param("positive", True, id="valid"),
    pytest.param("negative", True, id="invalid"),
    pytest.param("positive", False, id="no-key"),
]


@pytest.mark.parametrize(("mode", "with_key"), KEYED_RUNS)
def test_generated_requests_on_the_keyed_clip_server(mode, with_key, clip_server, trap):
    failures = fuzz(clip_server, trap, mode, with_key)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_generated_requests_on_the_reranker_server(mode, reranker_server, trap):
    failures = fuzz(reranker_server, trap, mode, with_key=True)
    assert not failures, "\n".join(failures)


# -- the issue's cases ---------------------------------------------------------------------------------------------
def bomb_png(side: int = 15_000) -> bytes:
    """A 1-bit grey PNG of ``side`` x ``side`` zero pixels: ~27 KB that decode to ``side``² pixels (PIL's
    decompression-bomb case), written chunk by chunk so the test never holds the pixels."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\x00" * (1 + (side + 7) // 8)  # filter byte, then the packed bits
    packer = zlib.compressobj(9)
    compressed = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", compressed) + chunk(b"IEND", b"")


@functools.cache
def bomb() -> bytes:
    return bomb_png()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def fine_png() -> bytes:
    return png_bytes(sample_images(1, seed=3)[0])


def media_requests(model: str, bad: str) -> dict[str, tuple[str, dict[str, Any], str]]:
    """Every route and field that carries media, each with the ``bad`` image URL, and how the refusal names it:
    Cohere's lists after a fine image (item 1); a chat-style conversation (one vector, one image) as its message."""
    fine = data_url(fine_png())

    def conversation(url: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]

    def cohere_input(url: str) -> dict[str, Any]:
        return {"content": [{"type": "image_url", "image_url": {"url": url}}]}

    cohere = {"model": model, "input_type": "image", "embedding_types": ["float"]}
    return {
        "openai-messages": ("/v1/embeddings", {"model": model, "messages": conversation(bad)}, "messages"),
        "pooling-messages": ("/pooling", {"model": model, "messages": conversation(bad)}, "messages"),
        "cohere-images": ("/v2/embed", {**cohere, "images": [fine, bad]}, SECOND_ITEM),
        "cohere-inputs": ("/v2/embed", {**cohere, "inputs": [cohere_input(fine), cohere_input(bad)]}, SECOND_ITEM),
    }


SECOND_ITEM = r"(?<![\d.])1(?![\d.])"  # the index 1, not a digit of a size or a version
MEDIA_ROUTES = list(media_requests("m", "u"))


def mounted(server: Server) -> set[str]:
    schema = httpx.get(server.url + "/openapi.json", headers=HEADERS, timeout=TIMEOUT).json()
    return set(schema["paths"])


def post(server: Server, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=HEADERS, timeout=TIMEOUT)


def assert_refused_naming(response: httpx.Response, item: str) -> None:
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    sentence = refusal_sentence(response)
    assert sentence, f"no one-sentence refusal: {response.text[:500]}"
    assert re.search(item, sentence), f"the refusal does not name the item ({item}): {sentence}"


def refused_without_a_connection(server: Server, trap: Trap, route: str, bad: str) -> None:
    """The request of ``route`` carrying ``bad`` is refused naming it, with no connection out. A route the server
    does not mount (vLLM's /pooling: only behind its flag) answers 404 and fetches nothing either."""
    path, body, item = media_requests(served_model(server, HEADERS), bad)[route]
    response = post(server, path, body)
    if path in mounted(server):
        assert_refused_naming(response, item)
    else:
        assert response.status_code == 404, f"{path} is not in the schema but answers {response.status_code}"
    assert_nothing_out(server, trap)


@pytest.mark.parametrize("route", MEDIA_ROUTES)
def test_a_remote_image_url_is_refused_without_a_connection(route, clip_server, trap):
    refused_without_a_connection(clip_server, trap, route, trap.url + "/cat.png")


def test_the_issues_image_url_request_is_refused_without_a_connection(clip_server, trap):
    """Issue 55's request exactly (no input type): today's vLLM fetched the URL and answered 200."""
    body = {"model": served_model(clip_server, HEADERS), "images": [trap.url + "/x.png"]}
    response = post(clip_server, "/v2/embed", body)
    assert 400 <= response.status_code < 500 and refusal_sentence(response), response.text[:500]
    assert_nothing_out(clip_server, trap)


@pytest.mark.parametrize("route", MEDIA_ROUTES)
def test_a_decompression_bomb_is_refused_naming_it(route, clip_server, trap):
    refused_without_a_connection(clip_server, trap, route, data_url(bomb()))


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v2/embed", "/embed", "/v2/rerank", "/rerank"])
def test_a_body_nested_20000_deep_is_a_4xx(path, clip_server):
    deep = "[" * 20_000 + "]" * 20_000
    body = f'{{"model": "m", "input": {deep}, "texts": {deep}, "inputs": {deep}, "query": "q", "documents": {deep}}}'
    response = httpx.post(
        clip_server.url + path,
        content=body.encode(),
        headers={**HEADERS, "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )
    assert 400 <= response.status_code < 500, f"{response.status_code}: {response.text[:500]}"
    assert refusal_sentence(response), f"no one-sentence refusal: {response.text[:500]}"


@pytest.mark.parametrize("input_type", ["search_document", "search_query", "classification", "clustering"])
def test_cohere_input_type_on_a_model_without_prompts_is_a_200(input_type, minilm_server, minilm_engine):
    model = served_model(minilm_server, {})
    body = {"model": model, "texts": ["a cat", "a dog"], "input_type": input_type, "embedding_types": ["float"]}
    response = httpx.post(minilm_server.url + "/v2/embed", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:500]
    got = np.asarray(response.json()["embeddings"]["float"], dtype=np.float32)
    assert min_row_cosine(got, minilm_engine.embed(["a cat", "a dog"])) >= 0.99999  # float32 on both sides


def test_cohere_rerank_with_null_max_tokens_per_doc_is_a_200(reranker_server):
    model = served_model(reranker_server, {})
    body = {"model": model, "query": "q", "documents": ["a", "b"], "top_n": None, "max_tokens_per_doc": None}
    response = httpx.post(reranker_server.url + "/v2/rerank", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text[:500]
    assert sorted(result["index"] for result in response.json()["results"]) == [0, 1]


def test_the_bomb_is_what_the_issue_measured():
    """27 KB that PIL itself refuses to open as a decompression bomb (15,000² 1-bit pixels)."""
    from PIL import Image

    with pytest.raises(Image.DecompressionBombError, match="225000000 pixels"):
        Image.open(io.BytesIO(bomb()))
    assert 20_000 < len(bomb()) < 40_000
