"""vLLM's V1 engine inside this process, driven from PoolingEngine's event loop.

vLLM's AsyncLLM always runs its engine core in a child process, and on the CPU its platform then forces another
process for the worker; each re-imports vLLM and torch. ``InprocEngine`` runs vLLM's ``LLMEngine`` with the
in-process client and the uni executor instead, behind the part of AsyncLLM's interface that PoolingEngine uses.

``LLMEngine`` is not thread-safe. Every scheduler mutation (add, abort) happens on the engine loop between
steps, and every step runs on one dedicated thread, so the loop keeps accepting callers while a step computes
and vLLM's scheduler batches whatever arrived meanwhile into the next step. The same thread builds the engine, so
the OpenMP thread team torch creates for it during the bucket warmup serves every step.

vLLM keeps the current engine config and the forward context (attention metadata) in module globals, so the
in-process engines of one process take turns: one builds, steps or answers an RPC at a time.

Imports: backend (the vLLM calls its front door names); vLLM inside the functions that start and run its engine.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import os
import queue
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from rbln_retrieval import backend

logger = logging.getLogger(__name__)

# Held by a step thread around each call into its engine (see the module docstring).
_TURN = threading.Lock()
# Engines of this process that are built and not yet shut down (changed only while holding _TURN).
_LIVE: set[int] = set()


def _after_fork_in_child() -> None:
    # A step thread of the parent may have held the turn at the fork; it does not exist here to release it.
    global _TURN
    _TURN = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def _stdout_with_a_descriptor() -> Iterator[None]:
    """While vLLM builds an engine, a ``sys.stdout`` with a file descriptor: vLLM silences C libraries around its
    process groups by redirecting ``sys.stdout.fileno()`` (``suppress_stdout``), which a program that redirected
    stdout to a StringIO (``contextlib.redirect_stdout``, pytest's capsys) does not have, and the start failed
    with "fileno". The process's own stdout stands in meanwhile: anything another thread prints during the
    build goes there, and nothing else changes."""
    if _has_descriptor(sys.stdout):
        yield
        return
    replaced, own = sys.stdout, sys.__stdout__
    stand_in = own if own is not None and _has_descriptor(own) else open(os.devnull, "w")  # noqa: SIM115
    sys.stdout = stand_in
    try:
        yield
    finally:
        sys.stdout = replaced
        if stand_in is not own:
            stand_in.close()


def _has_descriptor(stream: Any) -> bool:
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the last two
        return False
    return True


def _shut_down(engine: Any) -> None:
    """vLLM's engine-core shutdown, which also destroys the process's torch.distributed groups: other live
    in-process engines still step through them, so only the last engine's shutdown tears them down."""
    _LIVE.discard(id(engine))
    with backend.collections_deferred():  # _return_freed_memory collects once, after
        if _LIVE:
            backend.shutdown_keeping_distributed_groups(engine)
        else:
            engine.engine_core.shutdown()


def _return_freed_memory() -> None:
    """Give a closed engine's memory back to the OS. glibc keeps freed heap pages (weights, step buffers, compiled
    graphs) in its arenas, so a process that starts and closes engines would otherwise stay as large as all the
    engines it ever ran together."""
    gc.collect()  # vLLM's objects hold reference cycles; free them before trimming
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    if trim is not None:  # glibc only
        trim(0)


class InprocEngine:
    """``encode``, ``collective_rpc``, ``errored``, ``shutdown`` and ``get_num_unfinished_requests`` as AsyncLLM
    has them, over an ``LLMEngine`` in this process. Use it on the event loop that started it."""

    def __init__(self, engine: Any, stepper: StepThread) -> None:
        self._engine = engine
        self._stepper = stepper
        self._results: dict[str, asyncio.Future[Any]] = {}  # request id -> its final output, while a caller waits
        self._to_add: dict[str, tuple[Any, Any]] = {}  # submitted, not yet handed to vLLM
        self._to_abort: list[str] = []
        self._wake = asyncio.Event()
        self._failure: BaseException | None = None
        self._closed = False
        self._driver = asyncio.get_running_loop().create_task(self._drive(), name="rbln-retrieval-inproc-driver")

    @classmethod
    async def start(cls, engine_args: Any) -> InprocEngine:
        """Build the engine on its step thread; the caller sets the environment vLLM reads while it starts."""
        from vllm.v1.engine.llm_engine import LLMEngine

        stepper = StepThread()
        abandoned = threading.Event()

        def build() -> Any:
            backend.fresh_attention_backend_choice()
            # vLLM's start runs five full collections and then freezes the heap itself (unfrozen at shutdown);
            # freezing first keeps those collections off the application's heap, which dwarfs the engine's.
            gc.freeze()
            try:
                with _stdout_with_a_descriptor():
                    engine = LLMEngine.from_engine_args(engine_args)
            except BaseException:
                gc.unfreeze()
                raise
            _LIVE.add(id(engine))
            if abandoned.is_set():  # the caller gave up (Ctrl-C) while the engine loaded
                _shut_down(engine)
            return engine

        try:
            engine = await stepper.run(build)
        except BaseException:
            abandoned.set()
            stepper.stop()
            raise
        return cls(engine, stepper)

    # -- AsyncLLM's interface --------------------------------------------------------------------------------------
    @property
    def errored(self) -> bool:
        return self._failure is not None

    async def encode(self, prompt: Any, pooling_params: Any, request_id: str) -> AsyncIterator[Any]:
        """Yields the request's one (final) ``PoolingRequestOutput``; cancelling the caller aborts the request."""
        if self._failure is not None or self._closed:
            raise _dead() from self._failure
        result = asyncio.get_running_loop().create_future()
        self._results[request_id] = result
        self._to_add[request_id] = (prompt, pooling_params)
        self._wake.set()
        try:
            output = await result
        except BaseException:
            self._abandon(request_id)
            raise
        yield output

    async def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict[str, Any] | None = None
    ) -> list[Any]:
        """Runs on the step thread, so it never overlaps a step."""
        return await self._stepper.run(self._engine.collective_rpc, method, timeout, args, kwargs)

    async def reset_prefix_cache(self) -> bool:
        return await self._stepper.run(self._engine.reset_prefix_cache)

    def get_num_unfinished_requests(self) -> int:
        return self._engine.get_num_unfinished_requests() + len(self._to_add)

    def shutdown(self) -> None:
        """Stop driving, fail the callers still waiting, and free the engine once any running step is over."""
        if self._closed:
            return
        self._closed = True
        self._driver.cancel()
        self._fail_waiting(None)
        try:
            self._stepper.submit(_shut_down, self._engine).result()
        finally:
            self._stepper.stop()
            self._engine = None
            _return_freed_memory()

    # -- the driver ------------------------------------------------------------------------------------------------
    async def _drive(self) -> None:
        try:
            while True:
                self._apply_mutations()
                if not self._engine.has_unfinished_requests():
                    self._wake.clear()
                    await self._wake.wait()  # idle: no step until a caller submits
                    continue
                for output in await self._stepper.run(self._step):
                    result = self._results.pop(output.request_id, None) if output.finished else None
                    if result is not None and not result.done():
                        result.set_result(output)
        except Exception as exc:  # the engine's state is unknown now: it is dead and restarts on the next call
            logger.error("The in-process vLLM engine failed: %r", exc)
            self._failure = exc
            self._fail_waiting(exc)

    def _step(self) -> list[Any]:
        # vLLM's worker chooses its IR op kernels (RMSNorm) once per process; the engines of this process take
        # turns, so each step reinstates its own engine's choice (host kernels for bundled, vLLM's for stock).
        self._engine.vllm_config.kernel_config.ir_op_priority.set_default()
        return self._engine.step()

    def _apply_mutations(self) -> None:
        """Hand aborts and new requests to vLLM; runs on the loop between steps."""
        if self._to_abort:
            aborted, self._to_abort = self._to_abort, []
            self._engine.abort_request(aborted)
        added, self._to_add = self._to_add, {}
        for request_id, (prompt, params) in added.items():
            try:
                self._engine.add_request(request_id, prompt, params)
            except Exception as exc:  # vLLM refused this request (as AsyncLLM.encode would raise): fail its caller
                if (result := self._results.pop(request_id, None)) and not result.done():
                    result.set_exception(exc)

    def _abandon(self, request_id: str) -> None:
        """The caller stopped waiting: drop the request before vLLM sees it, or abort it between steps."""
        self._results.pop(request_id, None)
        if self._to_add.pop(request_id, None) is None and not self._closed:
            self._to_abort.append(request_id)
            self._wake.set()

    def _fail_waiting(self, cause: BaseException | None) -> None:
        self._to_add.clear()
        results, self._results = self._results, {}
        for result in results.values():
            if not result.done():
                error = _dead()
                error.__cause__ = cause
                result.set_exception(error)


class StepThread:
    """One daemon thread that runs calls in order. (concurrent.futures refuses new work once the interpreter is
    exiting, which is when the atexit hook still has to shut the engine down.)"""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, name="rbln-retrieval-step", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._calls.put((future, fn, args))
        return future

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.wrap_future(self.submit(fn, *args))

    def stop(self) -> None:
        """The thread ends after the calls already submitted."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if future.set_running_or_notify_cancel():
                try:
                    with _TURN:
                        result = fn(*args)
                except BaseException as exc:  # handed to the waiting caller
                    future.set_exception(exc)
                else:
                    future.set_result(result)


def _dead() -> Exception:
    from vllm.v1.engine.exceptions import EngineDeadError

    return EngineDeadError()
