"""Backpressure in front of vLLM's app: a bound on requests in flight and on the tokens they queue (past either,
HTTP 429 with Retry-After), and on what one request may cost: its body's bytes, its inputs, the characters of each
and its tokens (past any, HTTP 413 naming the limit, the value and the input).

vLLM's server queues every request it accepts: under a burst the queue, the memory it holds and every client's
latency grow without bound until clients time out. This pure ASGI middleware answers at once instead, so a client
backs off (RemoteEngine honours Retry-After) and the requests in flight keep their latency. Only POSTs count: the
probes, /metrics and the description route always answer. A request takes its slot before its body is read, so
slow uploads hold at most max_concurrent_requests bodies; its cost is read from the body before anything is
tokenized (cost.py: a scoring request's query counted once per document), so one request cannot queue more
tokenization than max_queued_tokens. A body's upload has a deadline (upload_seconds): a sender slower than that
gets 408 and its slot back, so slow senders cannot hold every slot. Refusals are answered in the route's dialect
(the app's ``error``).

A served model may have bounds of its own (a config entry's limit keys, MODEL_LIMITS: the same names): they tighten
the server's for that model's requests (its Gate), so a slow reranker cannot take every slot of a server it shares
with an embedder. The server's bounds still hold for every request together; a model's are applied once its request
picked it (served.py), which is after the body arrived: a body's upload time is the server's alone.

Imports: server (check, cost); nothing else beyond the standard library (an ASGI app needs no framework; the CLI
reads its options here).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.cost import Cost, request_cost

RETRY_AFTER_SECONDS = 1
# (path, status, message) -> the body of a refusal in the path's dialect.
ErrorBody = Callable[[str, int, str], bytes]


@dataclass(frozen=True)
class Limits:
    """The server's bounds (None: unbounded). Defaults: TEI's 512 concurrent requests and 2 MB payload; 1M queued
    tokens is about 2,000 full 512-token inputs, seconds of work for a CPU or one NPU; 2,048 inputs a request is
    OpenAI's embeddings bound; 262,144 characters (about 65,000 tokens) is over the longest context of every
    supported family, so only an input that truncation would mostly throw away is refused; 30 s to upload a body is
    a 2 MB body at about 70 KB/s, so only a sender far slower than any client on a network keeps a slot that long."""

    max_concurrent_requests: int | None = 512
    max_queued_tokens: int | None = 1_000_000
    max_payload_bytes: int | None = 2_000_000
    max_inputs_per_request: int | None = 2048
    max_input_chars: int | None = 262_144
    upload_seconds: int | None = 30

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}={value!r} must be a positive integer or None (unbounded).")

    def advertised(self) -> dict[str, int | None]:
        """What the description route tells clients, which split their calls under these bounds."""
        return asdict(self)

    def refusal(self, cost: Cost, whose: str = "the server's") -> str | None:
        """The sentence refusing a request of ``cost`` whatever else is in flight (HTTP 413), or None; ``whose``
        limits these are, in the sentence."""
        if self.max_inputs_per_request is not None and cost.inputs > self.max_inputs_per_request:
            return (
                f"The request has {cost.inputs} items in `{cost.what}`, over {whose} max_inputs_per_request of "
                f"{self.max_inputs_per_request}; split it into smaller requests."
            )
        if self.max_input_chars is not None and cost.longest is not None and cost.longest[1] > self.max_input_chars:
            name, chars = cost.longest
            return (
                f"`{name}` is {chars} characters, over {whose} max_input_chars of {self.max_input_chars}; "
                "shorten it (only the model's max length in tokens is kept of it) or split it."
            )
        if self.max_queued_tokens is not None and cost.tokens > self.max_queued_tokens:
            return (
                f"The request costs about {cost.tokens} tokens to tokenize ({cost.basis}), over {whose} "
                f"max_queued_tokens of {self.max_queued_tokens}; split it into smaller requests."
            )
        return None

    def too_large(self, size: int, whose: str = "the server's") -> str:
        """The sentence refusing a body of ``size`` bytes past max_payload_bytes (HTTP 413)."""
        return (
            f"The request body is {size} bytes, over {whose} max_payload_bytes of {self.max_payload_bytes}; split "
            "it into smaller requests."
        )

    def tightened(self, own: dict[str, int], model: str) -> Limits:
        """These bounds with ``model``'s ``own`` (MODEL_LIMITS keys) in place; an own bound looser than the
        server's is refused naming it, since the server's bound would still hold."""
        for name, value in own.items():
            if name not in MODEL_LIMITS:
                known = ", ".join(MODEL_LIMITS)
                raise ValueError(f"{model}: {name} is not a limit a model may set (those are: {known}).")
            bound = getattr(self, name)
            if bound is not None and value > bound:
                raise ValueError(
                    f"{model}: {name}={value} is over the server's {name} of {bound}; a model's limit can only "
                    "tighten the server's."
                )
        return dataclasses.replace(self, **own)


# The limits a served model may set for itself: all but the upload deadline, which runs before the body names it.
MODEL_LIMITS = tuple(name for name in Limits.__dataclass_fields__ if name != "upload_seconds")


class Gate:
    """One served model's own bounds (its Limits, the server's tightened) and what its admitted requests hold of
    them; one per model per server process (one event loop, so no lock)."""

    def __init__(self, model: str, limits: Limits):
        self.model, self.limits = model, limits
        self.in_flight = 0
        self.queued_tokens = 0

    def admit(self, path: str, body: bytes) -> int:
        """Take a slot and the tokens of a POST of ``body`` to ``path``, returning the tokens to give back through
        release(); a request past this model's bounds is Refused (413 too large, 429 busy) naming the model."""
        limits, whose = self.limits, f"the model {self.model}'s"
        if limits.max_payload_bytes is not None and len(body) > limits.max_payload_bytes:
            raise Refused(limits.too_large(len(body), whose), "too_large")
        cost = request_cost(path, body)
        if too_costly := limits.refusal(cost, whose):
            raise Refused(too_costly, "too_large")
        slots, tokens = limits.max_concurrent_requests, limits.max_queued_tokens
        if slots is not None and self.in_flight >= slots:
            self._busy(f"{self.in_flight} requests in flight, its max_concurrent_requests of {slots}")
        if tokens is not None and self.queued_tokens + cost.tokens > tokens:
            self._busy(f"{self.queued_tokens} tokens queued, near its max_queued_tokens of {tokens}")
        self.in_flight += 1
        self.queued_tokens += cost.tokens
        return cost.tokens

    def release(self, tokens: int) -> None:
        """Give back what admit() took."""
        self.in_flight -= 1
        self.queued_tokens -= tokens

    def _busy(self, busy: str) -> NoReturn:
        raise Refused(f"The model {self.model} is busy ({busy}); retry after {RETRY_AFTER_SECONDS} s.", "overloaded")


def openai_error(path: str, status: int, message: str) -> bytes:
    """The OpenAI-shaped refusal, for an app that names no dialects."""
    return json.dumps({"error": {"message": message, "type": "", "param": None, "code": status}}).encode()


class Backpressure:
    """ASGI middleware bounding ``app`` by ``limits``; one instance per server process (one event loop)."""

    def __init__(self, app: Any, limits: Limits, error: ErrorBody = openai_error):
        self.app, self.limits, self.error = app, limits, error
        self.in_flight = 0
        self.queued_tokens = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        limits, path = self.limits, _path(scope)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if limits.max_payload_bytes is not None and declared is not None and int(declared) > limits.max_payload_bytes:
            await self._refuse(send, 413, self.error(path, 413, limits.too_large(int(declared))))
            return
        if limits.max_concurrent_requests is not None and self.in_flight >= limits.max_concurrent_requests:
            bound = limits.max_concurrent_requests
            await self._busy(send, path, f"{self.in_flight} requests in flight, the max_concurrent_requests of {bound}")
            return
        # The slot is held while the body is read, so slow uploads hold at most max_concurrent_requests bodies, each
        # for at most upload_seconds.
        self.in_flight += 1
        try:
            await self._admit(scope, receive, send)
        finally:
            self.in_flight -= 1

    async def _admit(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Read the body (bounded), refuse it past a limit of its cost, else run the app with its tokens queued."""
        limits, path = self.limits, _path(scope)
        try:
            async with asyncio.timeout(limits.upload_seconds):
                body = await self._body(receive)
        except TimeoutError:
            message = f"The request body did not arrive within the server's upload_seconds of {limits.upload_seconds}."
            await self._refuse(send, 408, self.error(path, 408, message))
            return
        except _TooLarge as exc:
            await self._refuse(send, 413, self.error(path, 413, limits.too_large(exc.size)))
            return
        if body is None:  # the client left
            return
        cost = request_cost(path, body)
        if too_costly := limits.refusal(cost):
            await self._refuse(send, 413, self.error(path, 413, too_costly))
            return
        tokens = cost.tokens
        if limits.max_queued_tokens is not None and self.queued_tokens + tokens > limits.max_queued_tokens:
            bound = limits.max_queued_tokens
            await self._busy(send, path, f"{self.queued_tokens} tokens queued, near the max_queued_tokens of {bound}")
            return
        self.queued_tokens += tokens
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            message: dict[str, Any] = await receive()  # then the disconnect, when the client goes
            return message

        try:
            await self.app(scope, replay, send)
        finally:
            self.queued_tokens -= tokens

    async def _body(self, receive: Any) -> bytes | None:
        """The whole body (None: the client disconnected), read here so a chunked upload cannot pass the payload
        bound either; the app gets it replayed."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if self.limits.max_payload_bytes is not None and size > self.limits.max_payload_bytes:
                raise _TooLarge(size)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _busy(self, send: Any, path: str, busy: str) -> None:
        message = f"The server is busy ({busy}); retry after {RETRY_AFTER_SECONDS} s."
        await self._refuse(send, 429, self.error(path, 429, message), retry_after=True)

    @staticmethod
    async def _refuse(send: Any, status: int, body: bytes, retry_after: bool = False) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if retry_after:
            headers.append((b"retry-after", str(RETRY_AFTER_SECONDS).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(Exception):
    def __init__(self, size: int):
        self.size = size


def _path(scope: dict[str, Any]) -> str:
    return str(scope.get("path", "")).removeprefix(scope.get("root_path", ""))


def add_backpressure(app: Any, limits: Limits, error: ErrorBody = openai_error) -> None:
    """Put Backpressure in front of ``app``'s built middleware stack, answering refusals with ``error``."""
    app.middleware_stack = Backpressure(app.middleware_stack or app.build_middleware_stack(), limits, error)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve command's options for Limits' fields (0: no limit)."""
    group = parser.add_argument_group("backpressure (0: no limit; docs/serving.md says how to size each)")
    for name, past_it in (
        ("max_concurrent_requests", "requests in flight; past it: HTTP 429 + Retry-After"),
        (
            "max_queued_tokens",
            "tokens of the requests in flight, estimated as bytes/4 (a scoring request's query once per document); "
            "past it: 429; one request over it alone: 413",
        ),
        ("max_payload_bytes", "a request's body; past it: HTTP 413"),
        ("max_inputs_per_request", "texts, or documents to score, in one request; past it: HTTP 413"),
        ("max_input_chars", "characters of one text, query or document; past it: HTTP 413"),
        ("upload_seconds", "seconds a request's body may take to arrive; past it: HTTP 408 and the slot freed"),
    ):
        default = getattr(Limits(), name)
        group.add_argument(
            f"--{name.replace('_', '-')}",
            type=_bound,
            default=default,
            metavar="N",
            help=f"{past_it} (default: {default})",
        )


def limits_from_args(args: argparse.Namespace) -> Limits:
    return Limits(**{name: getattr(args, name) for name in Limits.__dataclass_fields__})


def _bound(text: str) -> int | None:
    """A limit on the command line: a positive integer, or 0 for none."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer (0: no limit)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative (0: no limit)")
    return value or None
