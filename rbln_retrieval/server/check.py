"""The check every request body passes before any work, and the one way every refusal is answered.

A body is parsed as JSON with its nesting bounded (MAX_DEPTH: a request of this API nests a few levels; a body
nesting 20,000 lists is refused in one sentence before Python's recursion limit is met), then validated into the
route's typed request (a pydantic model), whose first error becomes one sentence naming the field. A refusal is a
``Refused`` (a sentence and its kind); each dialect answers it in its own error body and status codes: TEI's
``{"error", "error_type"}`` with 413/422/424/429, Cohere's ``{"message"}``, and OpenAI's
``{"error": {"message", "type", "param", "code"}}`` for the OpenAI, Jina/vLLM and this package's own routes (the
body RemoteEngine reads). Whatever fails below the check is answered 500 with the request's id and no traceback.

Imports: pydantic; nothing else beyond the standard library.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

# A request body nests deeper than this: refused. The deepest legitimate body (a chat conversation's content
# part's image_url) nests 6 levels.
MAX_DEPTH = 32

Kind = Literal["validation", "tokenizer", "wrong_model", "not_found", "too_large", "overloaded", "empty", "backend"]
Dialect = Literal["openai", "tei", "cohere"]

# Each dialect's status for each kind of refusal (TEI: 422 validation, 424 wrong model type, 413 too large).
STATUS: dict[Dialect, dict[Kind, int]] = {
    "openai": {"wrong_model": 400, "validation": 400, "tokenizer": 400, "empty": 400},
    "cohere": {"wrong_model": 400, "validation": 400, "tokenizer": 400, "empty": 400},
    "tei": {"wrong_model": 424, "validation": 422, "tokenizer": 422, "empty": 422},
}
COMMON_STATUS: dict[Kind, int] = {"not_found": 404, "too_large": 413, "overloaded": 429, "backend": 500}
OPENAI_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    413: "RequestTooLarge",
    422: "UnprocessableEntity",
    429: "TooManyRequests",
    500: "InternalServerError",
}
TEI_TYPES: dict[Kind, str] = {"too_large": "validation", "not_found": "validation", "wrong_model": "backend"}

M = TypeVar("M", bound=BaseModel)


class Refused(Exception):
    """A request refused in one sentence; ``kind`` picks the status in the route's dialect."""

    def __init__(self, message: str, kind: Kind = "validation"):
        super().__init__(message)
        self.message, self.kind = message, kind


def status_of(dialect: Dialect, kind: Kind) -> int:
    return STATUS[dialect].get(kind) or COMMON_STATUS[kind]


def error_body(dialect: Dialect, status: int, message: str, kind: Kind | None = None) -> dict[str, Any]:
    """The body a client of ``dialect`` reads a refusal from."""
    if dialect == "tei":
        return {"error": message, "error_type": TEI_TYPES.get(kind or "validation", kind or "validation")}
    if dialect == "cohere":
        return {"message": message}
    kind_name = OPENAI_TYPES.get(status, "BadRequestError")
    return {"error": {"message": message, "type": kind_name, "param": None, "code": status}}


def parse_json(body: bytes) -> Any:
    """``body`` as JSON, nesting at most MAX_DEPTH levels; else Refused."""
    if not body.strip():
        raise Refused("The request has no body; send a JSON object.", "empty")
    try:
        value = json.loads(body)
    except RecursionError:
        raise Refused(f"The body nests deeper than {MAX_DEPTH} levels; no request of this API does.") from None
    except ValueError as exc:  # UnicodeDecodeError is one
        raise Refused(f"The body is not valid JSON ({_json_error(exc)}).") from None
    _check_depth(value)
    return value


def _json_error(exc: ValueError) -> str:
    return f"{exc.msg} at position {exc.pos}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"


def _check_depth(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Refused(f"The body nests deeper than {MAX_DEPTH} levels; no request of this API does.")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))


def parse_request(body: bytes, model: type[M]) -> M:
    """``body`` as the route's typed request ``model``; else Refused naming the first bad field."""
    value = parse_json(body)
    if not isinstance(value, dict):
        raise Refused(f"The body is a JSON {type(value).__name__}, not an object with the request's fields.")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise Refused(validation_sentence(exc)) from None


def validation_sentence(exc: ValidationError) -> str:
    """The first of pydantic's errors as one sentence naming the field (its input is never echoed: it may be
    megabytes, or an image)."""
    error = exc.errors(include_url=False, include_input=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "the body"
    message = str(error["msg"]).removeprefix("Value error, ").rstrip(".")
    return f"`{where}`: {message}."
