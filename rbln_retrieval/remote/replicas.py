"""HTTP to one or more `rbln-retrieval serve` replicas: requests are spread over the healthy ones, a replica that
fails is taken out for a cool-down and the request is retried elsewhere with backoff, so a request either gets one
answer or raises RemoteError after bounded retries. A busy server (HTTP 429) is asked again after its Retry-After,
as often as the call's timeout allows, and the requests in flight are kept under the servers' advertised bound.
Nothing here knows about models; RemoteEngine does.

Imports: errors; httpx.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from rbln_retrieval.errors import RBLNRetrievalError


class RemoteError(RBLNRetrievalError, ConnectionError):
    """No replica answered usably within the retries (connection refused, timeout, 5xx, malformed JSON)."""


class RemoteAuthError(RBLNRetrievalError, PermissionError):
    """The server rejected the API key (HTTP 401/403); retrying cannot help."""


# Waits on a busy server: Retry-After when it sends one (capped), else this; jittered so clients do not return at once.
DEFAULT_RETRY_AFTER = 1.0
MAX_RETRY_AFTER = 30.0


@dataclass
class _Replica:
    url: str
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
        self.urls = [u.rstrip("/") for u in urls]
        self._replicas = [_Replica(u) for u in self.urls]
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

    def _auth_failed(self, replica: _Replica, response: httpx.Response) -> RemoteAuthError:
        return RemoteAuthError(
            f"{replica.url} rejected the request with HTTP {response.status_code}: "
            "set api_key (or RBLN_API_KEY) to the server's key."
        )

    async def get_first(self, path: str) -> tuple[bool, Any]:
        """(whether a replica answered, its JSON for ``path`` or None when it has no such route), asking the
        replicas in order; an unreachable replica or an unreadable answer moves on to the next."""
        for replica in self._replicas:
            try:
                response = await self._http().get(replica.url + path)
            except httpx.HTTPError:
                continue
            if response.status_code in (401, 403):
                raise self._auth_failed(replica, response)
            if response.status_code == 404:
                return True, None
            try:
                return True, response.json()
            except ValueError:
                continue
        return False, None

    def _pick(self) -> _Replica:
        now = time.monotonic()
        healthy = [r for r in self._replicas if r.down_until <= now]
        if healthy:
            return random.choice(healthy)
        return min(self._replicas, key=lambda r: r.down_until)  # all down: try the one that went down first

    async def post(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """The JSON answer of one replica to ``body``; 4xx raise ValueError with the server's message at once."""
        if self._slots is None:  # made on the loop that uses it (a forked child has another)
            self._slots = asyncio.Semaphore(self._max_in_flight)
        async with self._slots:
            return await self._post(path, body, timeout)

    async def _post(self, path: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        timeout = timeout or self.timeout
        # A busy server is waited for until the call's timeout has passed (from the first attempt), never longer.
        deadline = time.monotonic() + timeout
        failure = "no attempt made"
        attempt = 0
        while attempt <= self._max_retries:
            replica = self._pick()
            try:
                response = await self._http().post(replica.url + path, json=body, timeout=timeout)
            except httpx.TimeoutException:
                failure = f"{replica.url} timed out after {timeout:g} s"
            except httpx.TransportError as exc:
                failure = f"could not reach {replica.url} ({type(exc).__name__}: {exc})"
            else:
                if response.status_code in (401, 403):
                    raise self._auth_failed(replica, response)
                if response.status_code == 429:
                    self.throttled += 1
                    wait = _retry_after(response) * (1.0 + 0.25 * random.random())
                    if time.monotonic() + wait > deadline:
                        raise RemoteError(
                            f"{replica.url}{path} stayed busy (HTTP 429) past the call's timeout of {timeout:g} s; "
                            "raise timeout, or the server's --max-concurrent-requests, or add replicas."
                        )
                    await asyncio.sleep(wait)
                    continue  # not the replica's fault: neither a failure nor an attempt
                if 400 <= response.status_code < 500:
                    message = _error_message(response)
                    if self._api_key:  # a proxy may echo the request headers back
                        message = message.replace(self._api_key, "***")
                    raise ValueError(f"{replica.url}{path} rejected the request: {message}")
                if response.status_code >= 500:
                    failure = f"{replica.url} answered HTTP {response.status_code}"
                else:
                    try:
                        payload: dict[str, Any] = response.json()
                        replica.succeeded()
                        return payload
                    except ValueError:
                        failure = f"{replica.url} answered with malformed JSON"
            replica.failed()
            if attempt < self._max_retries:
                await asyncio.sleep(min(4.0, 0.25 * 2**attempt) * (0.5 + random.random()))
            attempt += 1
        raise RemoteError(f"{path} failed after {self._max_retries + 1} attempts; last: {failure}.")


def _retry_after(response: httpx.Response) -> float:
    """Seconds a 429 asks to wait (Retry-After in seconds; an HTTP date or none: DEFAULT_RETRY_AFTER), capped."""
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(response.headers.get("retry-after", DEFAULT_RETRY_AFTER))))
    except ValueError:
        return DEFAULT_RETRY_AFTER


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", response.json())
        return str(error.get("message", error) if isinstance(error, dict) else error)
    except ValueError:
        return response.text[:200]
