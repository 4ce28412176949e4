"""A misbehaving HTTP server on loopback for remote-mode fault and secrecy tests: no model, one canned answer per
POST."""

from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import pytest

Mode = Literal["500", "garbage", "wrong-shape", "sleep", "echo-headers", "busy"]


class FakeServer:
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

        class Handler(BaseHTTPRequestHandler):
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
                try:
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout): expected
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

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
