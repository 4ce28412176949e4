"""The API key on every route of the server but the probes.

A request carries the key as ``Authorization: Bearer <key>`` (what the OpenAI, Cohere, TEI and Jina clients send);
every path except the liveness and monitoring probes answers 401 without it, in the route's dialect. Keys are
compared in constant time.

Imports: nothing beyond the standard library (an ASGI middleware needs no framework).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})
# (path, status, message) -> the body of a refusal in the path's dialect.
ErrorBody = Callable[[str, int, str], bytes]


class GuardEveryRoute:
    """ASGI middleware answering 401 to a request without one of ``keys``, on every path but OPEN_PATHS."""

    def __init__(self, app: Any, keys: list[str], error: ErrorBody):
        self.app, self.keys, self.error = app, [key.encode() for key in keys], error

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path not in OPEN_PATHS and not self._authorized(scope):
                body = self.error(path, 401, "Unauthorized: send the server's API key as `Authorization: Bearer KEY`.")
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def _authorized(self, scope: dict[str, Any]) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and any(hmac.compare_digest(token.strip(), key) for key in self.keys)


def guard_every_route(app: Any, api_keys: list[str] | None, error: ErrorBody) -> None:
    """Put GuardEveryRoute in front of ``app``'s built middleware stack when the server takes API keys."""
    if keys := [key for key in api_keys or [] if key]:
        app.middleware_stack = GuardEveryRoute(app.middleware_stack, keys, error)
