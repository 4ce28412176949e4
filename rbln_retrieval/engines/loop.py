"""A private event loop thread that owns the vLLM async engine.

Sync callers block on a future; async callers on any event loop await the same future without blocking their
loop, so concurrent callers from threads and loops all land in one engine and are batched by its scheduler.

Imports: errors.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from rbln_retrieval.errors import EngineForkedError

T = TypeVar("T")


class EngineLoop:
    def __init__(self, name: str = "rbln-retrieval-engine"):
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def forked(self) -> bool:
        """True in a child forked after this loop started: the thread that runs the loop exists only in the parent."""
        return os.getpid() != self.pid

    def _check_process(self, coro: Coroutine[Any, Any, Any]) -> None:
        if self.forked:
            coro.close()
            raise EngineForkedError(
                f"This engine was started in process {self.pid} and cannot run in its forked child {os.getpid()}; "
                "get one in the child with PoolingEngine.shared(...) or get_engine(...), which start a fresh one."
            )

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the engine loop and wait; an interrupt (Ctrl-C) cancels it there too."""
        self._check_process(coro)
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` from another event loop; cancelling the caller cancels it on the engine loop."""
        self._check_process(coro)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close(self) -> None:
        if self.loop.is_closed() or self.forked:  # a forked child's copy has no thread to stop
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self.loop.close()
