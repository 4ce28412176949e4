"""Fake HTTP servers on loopback for remote-mode fault and secrecy tests, without a model: FakeServer misbehaves with
one canned answer per POST, FakeModelServer describes a model and answers embeddings and scores of a fake one."""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

import numpy as np
import pytest

from rbln_retrieval import quantize_embeddings
from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH

Mode = Literal["500", "garbage", "wrong-shape", "sleep", "echo-headers", "busy"]


class _Replying(BaseHTTPRequestHandler):
    """A quiet handler that answers with a JSON body (headers with an empty value are left out)."""

    def reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            self.send_response(status)
            for name, value in (headers or {}).items():
                if value:
                    self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): expected
            pass

    def log_message(self, *args: object) -> None:
        pass


class _Loopback:
    """A threading HTTP server on a free loopback port, serving while the ``with`` block runs."""

    def _listen(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class FakeServer(_Loopback):
    """Answers every POST with ``mode``: HTTP 500, a 200 that is not JSON, JSON without the fields a pooling
    server sends, a reply after ``delay`` seconds, or a 400 whose body echoes the request headers (as a careless
    proxy might), or (busy) HTTP 429 with ``Retry-After: retry_after`` ("": none) for the first ``busy_posts``
    POSTs and then the sleep mode's answer. Records the time and the JSON body of every POST."""

    def __init__(self, mode: Mode, delay: float = 0.0, busy_posts: int = 0, retry_after: str = "1"):
        self.mode, self.delay = mode, delay
        self.busy_posts, self.retry_after = busy_posts, retry_after
        self.posts: list[float] = []
        self.bodies: list[Any] = []  # each POST's JSON body
        server = self

        class Handler(_Replying):
            def do_GET(self) -> None:  # /v1/models: unknown here, so the client uses its own model name
                self._reply(404, b'{"error": "not found"}')

            def do_POST(self) -> None:
                server.posts.append(time.monotonic())
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.bodies.append(json.loads(raw) if raw else None)
                if server.mode == "500":
                    self._reply(500, b'{"error": "internal"}')
                elif server.mode == "garbage":
                    self._reply(200, b"<html>not json at all")
                elif server.mode == "wrong-shape":
                    self._reply(200, b'{"object": "list"}')
                elif server.mode == "busy" and len(server.posts) <= server.busy_posts:
                    extra = {"Retry-After": server.retry_after} if server.retry_after else {}
                    self._reply(429, b'{"error": {"message": "busy"}}', extra)
                elif server.mode == "echo-headers":
                    self._reply(400, json.dumps({"error": {"message": f"bad request: {dict(self.headers)}"}}).encode())
                else:
                    time.sleep(server.delay)
                    self._reply(200, b'{"data": []}')

            def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.reply(status, body, headers)

        self._listen(Handler)

    def gaps(self) -> list[float]:
        """Seconds between consecutive POSTs (the client's backoff)."""
        return [b - a for a, b in zip(self.posts, self.posts[1:])]


API_KEY = "sk-rbln-test-5e1f0c2d9a"


def assert_api_key_hidden(
    make: Callable[[str], Any], use: Callable[[Any], Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Build an object with ``make(base_url)`` (it must pass API_KEY), let ``use`` fail against a server that
    echoes the request headers and one that answers 500, and grep its repr, str, the raised errors with their
    tracebacks and causes, and every log record for the key."""
    caplog.set_level(logging.DEBUG)
    with FakeServer("echo-headers") as echo, FakeServer("500") as failing:
        for server in (echo, failing):
            obj = make(server.url)
            with pytest.raises(Exception) as raised:
                use(obj)
            shown = {"repr": repr(obj), "str": str(obj), "error": "".join(traceback.format_exception(raised.value))}
            for where, text in {**shown, "logs": caplog.text}.items():
                assert API_KEY not in text, f"the API key appears in the {where}"
            if server is echo:  # the key did reach the server, and came back redacted
                assert "Bearer ***" in str(raised.value)


# A bi-encoder with E5's prompts, as `rbln-retrieval serve` describes one: 4-dimensional vectors.
E5_FAMILY = {
    "name": "bi-encoder",
    "architecture": "BertModel",
    "hidden_size": 4,
    "max_length": 512,
    "pooling": "MEAN",
    "query_prompt": "query: ",
    "document_prompt": "passage: ",
}


def vector_of(text: str) -> list[float]:
    """The fake model's vector of ``text``: four numbers from its bytes (not normalized: the client does not care)."""
    data = text.encode()
    return [float(len(data)), float(sum(data) % 97), float(data.count(b" ")), 1.0]


class FakeModelServer(_Loopback):
    """A pooling server on loopback without a model, for fast client tests: GET DESCRIBE_PATH answers
    ``description`` (after ``describe_failures`` HTTP 502s, as a proxy in front of a restarting replica answers),
    POST /v1/embeddings answers vector_of(text) per input as base64 float32 (``nan_at``: those inputs get NaN),
    POST QUANTIZED_EMBED_PATH answers them in the precision asked, POST /score answers ``scores`` (or 0.5 per
    document); answers name ``answer_model`` when set, and pass through ``edit(path, answer)`` (a proxy that
    rewrites them) when given. Each POST's body is recorded in ``bodies``; ``entered`` is set when a POST arrives
    and, while ``hold`` is clear, the answer waits for it."""

    def __init__(
        self,
        description: dict[str, Any] | None = None,
        *,
        describe_failures: int = 0,
        nan_at: tuple[int, ...] = (),
        scores: list[float] | None = None,
        answer_model: str | None = None,
        retry_after: str | None = None,
        busy_posts: int = 0,
        edit: Callable[[str, dict[str, Any]], Any] | None = None,
    ):
        self.description, self.edit = description, edit
        self.describe_failures = describe_failures
        self.nan_at, self.scores, self.answer_model = nan_at, scores, answer_model
        self.retry_after, self.busy_posts = retry_after, busy_posts
        self.bodies: list[Any] = []
        self.posts: list[float] = []
        self.describes = 0
        self.entered, self.hold = threading.Event(), threading.Event()
        self.hold.set()
        server = self

        class Handler(_Replying):
            def do_GET(self) -> None:
                if self.path == "/v1/models" and server.description is not None:
                    return self._reply(200, {"data": [{"id": server.description["model"]}]})
                if self.path != "/v1/rbln-retrieval/model" or server.description is None:
                    return self._reply(404, {"error": "not found"})
                server.describes += 1
                if server.describes <= server.describe_failures:
                    return self._reply(502, {"error": "bad gateway"})
                self._reply(200, server.description)

            def do_POST(self) -> None:
                server.posts.append(time.monotonic())
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                server.bodies.append(body)
                if len(server.posts) <= server.busy_posts:
                    return self._reply(429, {"error": {"message": "busy"}}, {"Retry-After": server.retry_after or ""})
                server.entered.set()
                server.hold.wait()
                named = {"model": server.answer_model} if server.answer_model else {}
                if self.path in ("/v1/embeddings", QUANTIZED_EMBED_PATH):
                    rows = np.asarray([vector_of(t) for t in body["input"]], dtype="<f4").reshape(-1, 4)
                    for i in server.nan_at:
                        if i < len(rows):
                            rows[i][1] = float("nan")
                    extra: dict[str, Any] = {}
                    if self.path == QUANTIZED_EMBED_PATH:
                        ranges = None if body.get("ranges") is None else np.asarray(body["ranges"])
                        rows = quantize_embeddings(rows, body["precision"], ranges=ranges)
                        extra = {"precision": body["precision"], "dtype": rows.dtype.name}
                    data = [
                        {"index": i, "embedding": base64.b64encode(r.tobytes()).decode()} for i, r in enumerate(rows)
                    ]
                    return self._reply(200, {"data": data, **extra, **named})
                scores = server.scores or [0.5] * len(body["documents"])
                self._reply(200, {"data": [{"index": i, "score": s} for i, s in enumerate(scores)], **named})

            def _reply(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
                if server.edit is not None and status == 200 and self.command == "POST":
                    payload = server.edit(self.path, payload)
                # NaN travels as JSON's NaN token, as Python writes it; bytes go as they are.
                self.reply(status, payload if isinstance(payload, bytes) else json.dumps(payload).encode(), headers)

        self._listen(Handler)

    def __exit__(self, *exc_info: object) -> None:
        self.hold.set()  # a held answer would keep the server's shutdown waiting
        super().__exit__(*exc_info)

    def inputs(self) -> list[str]:
        """Every input the POSTs carried, in the order they arrived."""
        return [t for body in self.bodies for t in body.get("input", body.get("documents", []))]


def described(family: dict[str, Any] = E5_FAMILY, model: str = "e5-fake", **limits: int | None) -> dict[str, Any]:
    """A description as `rbln-retrieval serve` publishes it."""
    return {"model": model, "family": family, "quantized_embeddings": None, "limits": limits}
