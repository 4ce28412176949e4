"""The client's own event loop and the calls in flight on it: sync and async callers from any thread run their
call there, close() ends every call in flight with RemoteClosedError (never a thread left waiting on a loop that
stopped), and a forked child gets a loop and connections of its own.

Imports: engines (loop), errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Self, TypeVar

from rbln_retrieval.engines.loop import EngineLoop
from rbln_retrieval.errors import RBLNRetrievalError

T = TypeVar("T")


class RemoteClosedError(RBLNRetrievalError, RuntimeError):
    """The remote client was closed, before or during the call."""


class ClientLoop:
    """The loop half of a remote client; subclasses close their connections in ``_aclose`` and drop them after a
    fork in ``_forget_connections``."""

    def __init__(self, name: str) -> None:
        self._loop_name = name
        self._loop = EngineLoop(name)
        self._closed = False
        self._calls: set[asyncio.Task[Any]] = set()  # in flight on the loop: close() ends them

    async def _aclose(self) -> None:
        raise NotImplementedError

    def _forget_connections(self) -> None:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connections; calls in flight in other threads or loops raise RemoteClosedError."""
        self._closed = True
        if not self._loop.loop.is_closed() and not self._loop.forked:
            self._loop.run(self._shutdown())
        self._loop.close()

    async def _shutdown(self) -> None:
        calls = [task for task in self._calls if task is not asyncio.current_task()]
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await self._aclose()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        self._check_open(coro)
        return self._loop.run(self._tracked(coro))

    async def _arun(self, coro: Coroutine[Any, Any, T]) -> T:
        self._check_open(coro)
        return await self._loop.arun(self._tracked(coro))

    def _check_open(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self._closed:
            coro.close()
            raise RemoteClosedError(f"{self!r} is closed; make a new one.")
        # A forked child has a copy of this client without the loop thread and with the parent's connections.
        if self._loop.forked:
            self._loop = EngineLoop(self._loop_name)
            self._forget_connections()

    async def _tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` on the client's loop, ended by close() with RemoteClosedError rather than left waiting."""
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await coro
        except asyncio.CancelledError:
            if self._closed:
                raise RemoteClosedError(f"{self!r} was closed while this call was in flight.") from None
            raise
        finally:
            self._calls.discard(task)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
