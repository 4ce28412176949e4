"""The server's route table: every route it mounts, with its method, dialect, typed request and what it maps onto,
and how a route is mounted: body read, checked (check.py), handed to its handler with the served models, answered
or refused in its dialect.

Each handler is a thin adapter onto the one engine API (``RetrievalEngine``'s ``aembed``/``ascore``/``arerank`` and
PoolingEngine's ``aembed_images``), so a remote result equals a local one by construction. The handlers live by
dialect: openai_routes.py (OpenAI, and vLLM's /score that RemoteEngine uses), tei_routes.py (Hugging Face TEI),
cohere_routes.py (Cohere v2), rerank_routes.py (Jina/vLLM rerank), own_routes.py (this package's description,
quantized and token-level outputs); app.py gathers them into the table and adds the probes (/health, /ping,
/metrics, /version).

Imports: server (check, limits, media, metrics, responses, served); FastAPI and pydantic; the standard library.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from rbln_retrieval.server.check import Dialect, Refused, error_body, parse_request, status_of
from rbln_retrieval.server.limits import RETRY_AFTER_SECONDS
from rbln_retrieval.server.media import MediaCheck
from rbln_retrieval.server.metrics import observe
from rbln_retrieval.server.responses import error_responses
from rbln_retrieval.server.served import ServedModels

logger = logging.getLogger(__name__)

# The package's version, which /version and TEI's /info answer.
VERSION = importlib.metadata.version("rbln-retrieval")
# The status nginx logs for a request its client closed before the answer; no client reads it.
CLIENT_CLOSED_REQUEST = 499


@dataclass(frozen=True)
class Context:
    """What a handler works with: the served models, the media policy and the request's id."""

    models: ServedModels
    media: MediaCheck
    request_id: str


Handler = Callable[[Context, Any], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    """One mounted route. ``request`` is the typed body (None: a GET); ``onto`` says, for docs/serving.md, which
    engine call it maps onto; ``answer`` is the type of its 200 body (responses.py), which the schema declares."""

    path: str
    method: str
    dialect: Dialect
    request: type[BaseModel] | None
    handler: Handler
    onto: str
    answer: Any


def mount(
    app: FastAPI, routes: tuple[Route, ...], models: ServedModels, media: MediaCheck, *, log_requests: bool = False
) -> None:
    """Add ``routes`` to ``app``, each answering through ``models`` and ``media``, and their typed requests to the
    app's OpenAPI schema; ``log_requests`` logs each request (INFO, on this module's logger)."""
    if log_requests and not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    schemas: dict[str, Any] = {}
    for route in routes:
        extra = None
        if route.request is not None:
            schema = route.request.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[route.request.__name__] = schema
            ref = {"$ref": f"#/components/schemas/{route.request.__name__}"}
            extra = {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}
        app.add_api_route(
            route.path,
            _endpoint(route, models, media, log_requests),
            methods=[route.method],
            openapi_extra=extra,
            summary=f"{route.dialect}: {route.onto}",
            operation_id=f"{route.method.lower()}_{route.dialect}_{route.path.strip('/').replace('/', '_') or 'root'}",
            response_model=route.answer,
            responses=error_responses(route.dialect, route.method, _names_model(route)),
        )
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            schema.setdefault("components", {}).setdefault("schemas", {}).update(schemas)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _names_model(route: Route) -> bool:
    return route.request is not None and "model" in route.request.model_fields


def _endpoint(
    route: Route, models: ServedModels, media: MediaCheck, log_requests: bool
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        began = time.perf_counter()
        body = None if route.request is None else await request.body()
        table = models.for_request(route.path, body)
        context = Context(table, media, request.headers.get("x-request-id") or uuid.uuid4().hex)
        try:
            response = await answered(request, context, body)
        finally:
            table.release()
        observe(context.models.picked, route.path, response.status_code, time.perf_counter() - began)
        return response

    async def answered(request: Request, context: Context, body: bytes | None) -> Response:
        request_id = context.request_id
        if log_requests:
            logger.info("Added request %s: %s %s", request_id, route.method, route.path)
        try:
            typed = None if route.request is None or body is None else parse_request(body, route.request)
            answer = await _unless_disconnected(request, route.handler(context, typed))
            if answer is None:  # the client left and its work was cancelled: nobody reads this
                return Response(status_code=CLIENT_CLOSED_REQUEST)
        except Refused as refused:
            return refusal(route.dialect, refused)
        except (ValueError, TypeError) as exc:  # the engine's own sentence refusing an input or an option
            return refusal(route.dialect, Refused(str(exc)))
        except Exception:
            logger.exception("Request %s to %s failed.", request_id, route.path)
            message = f"The server failed on this request (request id {request_id}); its log names the cause."
            return refusal(route.dialect, Refused(message, "backend"))
        return answer if isinstance(answer, Response) else JSONResponse(answer)

    # FastAPI reads the annotation to inject the request; postponed annotations would leave it the string "Request".
    endpoint.__annotations__["request"] = Request
    endpoint.__name__ = f"{route.dialect}_{route.path.strip('/').replace('/', '_') or 'root'}"
    return endpoint


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """``work``'s answer, or None once the client disconnected first (the work is then cancelled)."""
    answer = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((answer, left), return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not answer.done():
            answer.cancel()
    return answer.result() if answer.done() and not answer.cancelled() else None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def refusal(dialect: Dialect, refused: Refused) -> JSONResponse:
    status = status_of(dialect, refused.kind)
    # A busy model is retried as a busy server is (limits.py's Backpressure answers the same header).
    headers = {"retry-after": str(RETRY_AFTER_SECONDS)} if refused.kind == "overloaded" else None
    return JSONResponse(error_body(dialect, status, refused.message, refused.kind), status_code=status, headers=headers)
