"""The API key on every route of the server, not only vLLM's guarded prefixes.

vLLM's middleware checks the key only under /v1, /v2, /inference and /cohere, so with ``--api-key`` its /score,
/rerank, /classify, /pooling and /tokenize routes would still answer anyone. This subclass keeps vLLM's token
check and guards every path except the liveness and monitoring probes.

Imports: vLLM's authentication middleware and starlette (loaded only by a running server).
"""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send
from vllm.entrypoints.serve.middleware.authenticate import AuthenticationMiddleware

OPEN_PATHS = frozenset({"/health", "/ping", "/metrics", "/version"})


class GuardEveryRoute(AuthenticationMiddleware):
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Any:
        if scope["type"] in ("http", "websocket") and scope.get("method") != "OPTIONS":
            path = scope["path"].removeprefix(scope.get("root_path", ""))
            if path not in OPEN_PATHS and not self.verify_token(Headers(scope=scope)):
                return JSONResponse(content={"error": "Unauthorized"}, status_code=401)(scope, receive, send)
        return self.app(scope, receive, send)


def guard_every_route(app: Any, api_keys: list[str] | None) -> None:
    """Put GuardEveryRoute in front of ``app`` (built, not yet started) when the server takes an API key; vLLM's
    own check stays inside it. The app's middleware stack is already built by then, so the guard wraps it."""
    from vllm import envs

    configured: list[str | None] = [*api_keys] if api_keys else [envs.VLLM_API_KEY]
    if tokens := [key for key in configured if key]:
        app.middleware_stack = GuardEveryRoute(app.middleware_stack or app.build_middleware_stack(), tokens)
