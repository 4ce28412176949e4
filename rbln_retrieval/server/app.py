"""The one app both servers run: `rbln-retrieval serve` (serve.py) and each Ray Serve replica (ray/serve.py).

A FastAPI app over a table of served models (served.py), mounting the project's route table (routes.py) and
nothing else: no route of vLLM's own server is mounted (its other routes, chat and completions among them, serve
generative models; a route here is one this package maps onto its engine API and has checked). In the order a
request meets them: the API key on every route but the probes (auth.py), backpressure and what one request may cost
(limits.py), the route's check of its body and media (check.py, media.py), the handler. Beside the table: the
probes /health (503 once an engine died), /ping, /metrics (Prometheus) and /version, which answer without the key.

Imports: server (auth, check, the dialects' route modules, limits, media, routes, served);
FastAPI, prometheus_client.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from rbln_retrieval.server import cohere_routes, openai_routes, own_routes, rerank_routes, tei_routes
from rbln_retrieval.server.auth import guard_every_route
from rbln_retrieval.server.check import Dialect, error_body
from rbln_retrieval.server.limits import Limits, add_backpressure
from rbln_retrieval.server.media import MediaCheck
from rbln_retrieval.server.routes import VERSION, Route, mount
from rbln_retrieval.server.served import ServedModels

# The probes' answers: 200 with no body while every engine serves, 503 with the dead models as JSON.
PROBE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Every engine serves (no body).", "content": {}},
    503: {
        "description": "An engine died.",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "status": {"type": "string"},
                        "models": {"type": "array", "items": {"type": "string"}},
                    },
                }
            }
        },
    },
}


def route_table() -> tuple[Route, ...]:
    """Every route the server mounts besides the probes, in docs/serving.md's order."""
    return (
        *openai_routes.ROUTES,
        *tei_routes.ROUTES,
        *cohere_routes.ROUTES,
        *rerank_routes.ROUTES,
        *own_routes.ROUTES,
    )


def build_app(
    models: ServedModels,
    *,
    limits: Limits,
    api_keys: list[str] | None = None,
    media: MediaCheck | None = None,
    request_id_headers: bool = False,
    log_requests: bool = False,
) -> FastAPI:
    """The server's app for ``models``: the route table, the probes, ``limits``, the API keys (None: open) and the
    media policy (default: no remote fetching); ``request_id_headers`` answers every request's id in
    ``x-request-id``; ``log_requests`` logs each request's id, route and status."""
    app = FastAPI(title="rbln-retrieval", version=VERSION)
    routes = route_table()
    mount(app, routes, models, media or MediaCheck(), log_requests=log_requests)

    # The probes answer what supervisors and Prometheus read (an empty 200, the exposition text); the schema
    # declares those content types so a client generated from it reads them as they are.
    @app.get("/health", response_class=Response, responses=PROBE_RESPONSES)
    async def health() -> Response:
        dead = [name for name, served in models.items() if getattr(served.engine, "errored", False)]
        if dead:
            return JSONResponse({"status": "engine dead", "models": dead}, status_code=503)
        return Response(status_code=200)

    @app.get("/ping", response_class=Response, responses=PROBE_RESPONSES)
    async def ping() -> Response:
        return await health()

    app.post("/ping", response_class=Response, responses=PROBE_RESPONSES, operation_id="ping_post")(ping)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": VERSION}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    dialects = _dialects(routes)

    def error(path: str, status: int, message: str) -> bytes:
        import json

        return json.dumps(error_body(dialects.get(path, "openai"), status, message)).encode()

    app.middleware_stack = app.build_middleware_stack()
    add_backpressure(app, limits, error)
    guard_every_route(app, api_keys, error)
    if request_id_headers:
        app.middleware_stack = RequestIdHeaders(app.middleware_stack)  # type: ignore[assignment]
    return app


def _dialects(routes: tuple[Route, ...]) -> dict[str, Dialect]:
    return {route.path: route.dialect for route in routes}


class RequestIdHeaders:
    """Answers every request's id (the client's ``x-request-id``, else a new one) in its ``x-request-id`` header."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        request_id = headers.get(b"x-request-id") or uuid.uuid4().hex.encode()
        if b"x-request-id" not in headers:
            scope = {**scope, "headers": [*scope.get("headers", []), (b"x-request-id", request_id)]}

        async def with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", request_id)]}
            await send(message)

        await self.app(scope, receive, with_id)
