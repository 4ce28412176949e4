"""HTTP to one or more `rbln-retrieval serve` replicas: requests are spread over the healthy ones, a replica that
fails is taken out for a cool-down and the request is retried elsewhere with backoff, so a request either gets one
answer or raises RemoteError after bounded retries. Every attempt, backoff and wait of a request runs under one
Deadline (a call's timeout covers all of its requests), never a fresh timeout per attempt. A busy server (HTTP 429)
is asked again after its Retry-After (parsed defensively and clamped), as often as the deadline allows, and the
requests in flight are kept under the servers' advertised bound. An answer is read up to MAX_RESPONSE_BYTES and
handed to the caller's check (rbln_retrieval.remote.answers), whose refusal becomes one sentence naming the replica.
Nothing here knows about models; RemoteEngine does.

Imports: errors, remote (answers); httpx.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from httpx import USE_CLIENT_DEFAULT

from rbln_retrieval.errors import RBLNRetrievalError
from rbln_retrieval.remote.answers import BadAnswer


class RemoteError(RBLNRetrievalError, ConnectionError):
    """No replica answered usably within the retries or the call's timeout (connection refused, timeout, 5xx,
    malformed JSON)."""


class UntrustedAnswerError(RemoteError):
    """A replica answered what no pooling server sends for the request (an index repeated or missing, a vector of
    another width or dtype, a body over MAX_RESPONSE_BYTES): refused, never handed on."""


class RemoteAuthError(RBLNRetrievalError, PermissionError):
    """The server rejected the API key (HTTP 401/403); retrying cannot help."""


# Waits on a busy server: Retry-After when it sends a usable one, else the default; clamped so that a "0", a negative
# or a NaN never makes a client re-send at once in a loop, and a far date never parks it; jittered so clients do not
# return at once.
DEFAULT_RETRY_AFTER = 1.0
# The most of one answer this client reads: the largest a server sends is a full batch of wide float32 vectors in
# base64 (2,048 x 4,096 dimensions: 45 MB); a body past this is a broken or hostile server, not a result.
MAX_RESPONSE_BYTES = 256 * 2**20
MIN_RETRY_AFTER = 0.25
MAX_RETRY_AFTER = 30.0


@dataclass(frozen=True)
class Deadline:
    """When a call (or, without a call timeout, one request) must be done: ``seconds`` from its start."""

    at: float
    seconds: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()


@dataclass
class _Replica:
    url: str  # without credentials: this is what messages and reprs show
    auth: httpx.BasicAuth | None = None  # the user and password the base_url held, sent but never shown
    secrets: tuple[str, ...] = ()  # the password, raw and as sent, redacted from every message
    down_until: float = 0.0
    failures: int = 0

    def failed(self) -> None:
        self.failures += 1
        self.down_until = time.monotonic() + min(60.0, 2.0**self.failures)

    def succeeded(self) -> None:
        self.failures, self.down_until = 0, 0.0


class Replicas:
    """An async HTTP client over ``urls`` with the bearer ``api_key``; use it on one event loop."""

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        verify: bool | str = True,
        max_in_flight: int = 8,
    ):
        self._replicas = [_replica(u) for u in urls]
        self.urls = [r.url for r in self._replicas]
        self._api_key = api_key
        self.timeout = timeout
        self._max_retries = max_retries
        self._verify = verify  # False, or a CA bundle's path for a server with a self-signed certificate
        self._client: httpx.AsyncClient | None = None
        # Requests in flight per replica: an engine batches across a few of them, and more only queue in the server,
        # where a large call's last requests would wait past their timeout; here they wait without one.
        self._per_replica = max_in_flight
        self._max_in_flight = max_in_flight * len(self._replicas)
        self._slots: asyncio.Semaphore | None = None
        self.throttled = 0  # HTTP 429 answers seen (each one waited out and retried)

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(headers=headers, timeout=self.timeout, verify=self._verify)
        return self._client

    def limit_in_flight(self, server_bound: int | None) -> None:
        """Keep the requests in flight per replica under a server's max_concurrent_requests too, so one client
        alone never meets that server's 429."""
        self._max_in_flight = min(self._per_replica, server_bound or self._per_replica) * len(self._replicas)
        self._slots = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def forget_connections(self) -> None:
        """After a fork: the parent's connections and semaphore are not this process's to use."""
        self._client, self._slots = None, None

    def _redact(self, text: str) -> str:
        """``text`` without the API key or any replica's password (an error may quote a request)."""
        for secret in filter(None, [self._api_key, *(s for r in self._replicas for s in r.secrets)]):
            text = text.replace(secret, "***")
        return text

    def _auth_failed(self, replica: _Replica, response: httpx.Response) -> RemoteAuthError:
        return RemoteAuthError(
            f"{replica.url} rejected the request with HTTP {response.status_code}: "
            "set api_key (or RBLN_API_KEY) to the server's key."
        )

    async def get(self, path: str, deadline: Deadline | None = None, url: str | None = None) -> Any:
        """The JSON answer to GET ``path`` (None: the server has no such route, HTTP 404), from the replica at
        ``url`` (None: any healthy one), retried as ``post`` retries."""
        replica = next(r for r in self._replicas if r.url == url) if url is not None else None
        return await self._request("GET", path, None, deadline or Deadline.after(self.timeout), replica)

    def _pick(self) -> _Replica:
        now = time.monotonic()
        healthy = [r for r in self._replicas if r.down_until <= now]
        if healthy:
            return random.choice(healthy)
        return min(self._replicas, key=lambda r: r.down_until)  # all down: try the one that went down first

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        deadline: Deadline | None = None,
        read: Callable[[Any], Any] | None = None,
    ) -> Any:
        """The JSON answer of one replica to ``body``, through ``read`` when given (its BadAnswer raises
        UntrustedAnswerError naming the replica); 4xx raise ValueError with the server's message at once.
        Without a ``deadline`` (the call has no timeout) the request gets the client's timeout for all its
        attempts, counted once it holds an in-flight slot."""
        if self._slots is None:  # made on the loop that uses it (a forked child has another)
            self._slots = asyncio.Semaphore(self._max_in_flight)
        if deadline is None:
            async with self._slots:
                return await self._request("POST", path, body, Deadline.after(self.timeout), read=read)
        slots = self._slots  # limit_in_flight may replace it meanwhile: released where acquired
        try:
            await (
                asyncio.wait_for(slots.acquire(), max(0.0, deadline.remaining())) if slots.locked() else slots.acquire()
            )
        except TimeoutError:
            raise RemoteError(
                f"{path} was not sent within the call's timeout of {deadline.seconds:g} s: every in-flight slot "
                "stayed busy; raise timeout or max_in_flight, or add replicas."
            ) from None
        try:
            return await self._request("POST", path, body, deadline, read=read)
        finally:
            slots.release()

    async def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        deadline: Deadline,
        pinned: _Replica | None = None,
        read: Callable[[Any], Any] | None = None,
    ) -> Any:
        if deadline.remaining() <= 0:  # spent before this request (the description, an earlier request)
            raise RemoteError(f"The call's timeout of {deadline.seconds:g} s passed before {path} was sent.")
        failure = "no attempt made"
        attempt = 0
        while attempt <= self._max_retries:
            replica = pinned or self._pick()
            remaining = deadline.remaining()
            client = self._http()
            try:
                request = client.build_request(method, replica.url + path, json=body, timeout=max(remaining, 0.001))
                response = await client.send(request, auth=replica.auth or USE_CLIENT_DEFAULT, stream=True)
                try:
                    content = await _bounded_body(response)
                finally:
                    await response.aclose()
            except httpx.TimeoutException:
                failure = f"{replica.url} timed out after {deadline.seconds:g} s (the call's timeout)"
            except httpx.TransportError as exc:
                failure = f"could not reach {replica.url} ({type(exc).__name__}: {self._redact(str(exc))})"
            except _TooLarge:
                raise UntrustedAnswerError(
                    f"{replica.url}{path} answered more than {MAX_RESPONSE_BYTES} bytes, the most this client reads "
                    "of one answer, so its answer is refused."
                ) from None
            else:
                if response.status_code in (401, 403):
                    raise self._auth_failed(replica, response)
                if response.status_code == 429:
                    self.throttled += 1
                    wait = retry_after(response.headers.get("retry-after")) * (1.0 + 0.25 * random.random())
                    if wait > deadline.remaining():
                        raise RemoteError(
                            f"{replica.url}{path} stayed busy (HTTP 429) past the call's timeout of "
                            f"{deadline.seconds:g} s; raise timeout, or the server's --max-concurrent-requests, or "
                            "add replicas."
                        )
                    await asyncio.sleep(wait)
                    continue  # not the replica's fault: neither a failure nor an attempt
                if method == "GET" and response.status_code == 404:
                    return None
                if 400 <= response.status_code < 500:
                    message = self._redact(_error_message(content))  # a proxy may echo the request headers
                    raise ValueError(f"{replica.url}{path} rejected the request: {message}")
                if response.status_code >= 500:
                    failure = f"{replica.url} answered HTTP {response.status_code}"
                else:
                    try:
                        payload = json.loads(content)
                    except ValueError:
                        failure = f"{replica.url} answered with malformed JSON"
                    else:
                        replica.succeeded()
                        return _checked(payload, read, f"{replica.url}{path}")
            replica.failed()
            attempt += 1
            backoff = min(4.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + random.random())
            if attempt <= self._max_retries and backoff >= deadline.remaining():
                raise RemoteError(
                    f"{path} got no answer within the call's timeout of {deadline.seconds:g} s ({attempt} "
                    f"attempt{'s' if attempt > 1 else ''}); last: {failure}."
                )
            if attempt <= self._max_retries:
                await asyncio.sleep(backoff)
        raise RemoteError(f"{path} failed after {self._max_retries + 1} attempts; last: {failure}.")


def _replica(url: str) -> _Replica:
    """A replica of ``url``; credentials in it (``https://user:password@host``) move to its auth, out of sight."""
    parsed = httpx.URL(url.rstrip("/"))
    if not (parsed.username or parsed.password):
        return _Replica(str(parsed))
    auth = httpx.BasicAuth(parsed.username, parsed.password)
    sent = base64.b64encode(f"{parsed.username}:{parsed.password}".encode()).decode()
    shown = str(parsed.copy_with(username=None, password=None))
    return _Replica(shown, auth, tuple(filter(None, (parsed.password, sent))))


def retry_after(header: str | None) -> float:
    """Seconds a 429 asks to wait: Retry-After as seconds or as an HTTP date, else DEFAULT_RETRY_AFTER (also for a
    NaN or an unreadable value), clamped to [MIN_RETRY_AFTER, MAX_RETRY_AFTER]."""
    seconds = DEFAULT_RETRY_AFTER
    if header is not None:
        try:
            seconds = float(header)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(header)
                seconds = when.timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                seconds = DEFAULT_RETRY_AFTER
    if math.isnan(seconds):
        seconds = DEFAULT_RETRY_AFTER
    return min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, seconds))


class _TooLarge(Exception):
    """An answer's body is over MAX_RESPONSE_BYTES."""


async def _bounded_body(response: httpx.Response) -> bytes:
    """The body of ``response``, read no further than MAX_RESPONSE_BYTES (_TooLarge past them)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_RESPONSE_BYTES:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _checked(payload: Any, read: Callable[[Any], Any] | None, where: str) -> Any:
    """``payload`` through ``read``, its refusal one sentence naming ``where`` (the replica and path)."""
    if read is None:
        return payload
    try:
        return read(payload)
    except BadAnswer as exc:
        raise UntrustedAnswerError(f"{where} answered {exc}, so its answer is refused.") from None


def _error_message(content: bytes) -> str:
    try:
        answer = json.loads(content)
    except ValueError:
        return content[:200].decode(errors="replace")
    error = answer.get("error", answer) if isinstance(answer, dict) else answer
    return str(error.get("message", error) if isinstance(error, dict) else error)
