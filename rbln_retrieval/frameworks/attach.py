"""One engine per model and options across a user's processes: a framework object's local engine, attached to the
process that holds it (holder.py) instead of started in every process of an app.

``attached_engine`` finds the engine's holder through its files (rendezvous.py), or starts one when there is none, and
returns an AttachedEngine: the engine's API whose calls run in the holder, with the results the process would have
computed itself. Each attached process holds a lease on the engine (a shared lock, released by the kernel when the
process dies); the holder exits when the last lease is gone.

The holder's exit is survived: a call that finds the holder gone (killed, crashed) attaches again, which starts a
new holder (one caller does, under the start lock; the others attach to it), and is sent once more; calls are
pure, so sending one twice is safe. Where attaching is impossible (a holder that is alive but does not answer), the
error is one sentence naming the holding process and the fixes.

Which objects share (``shares_across_processes``): RBLN_SHARE_ENGINES=1 every framework object's local engine,
=0 none; unset, those on an RBLN NPU (where each process would otherwise load the same graphs into the device's
memory), not those on the CPU (where processes share the cores anyway).

Imports: frameworks (holder, rendezvous), engines (options, shared), local (device); multiprocessing's connection.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from multiprocessing.connection import Client, Connection
from typing import Any

from rbln_retrieval.engines.options import EngineOptions, LocalModel
from rbln_retrieval.engines.shared import EngineSpec
from rbln_retrieval.frameworks.holder import CALLABLE, GETATTR, PING
from rbln_retrieval.frameworks.rendezvous import SHARE_ENV, EngineFiles, lock, locked, share_setting
from rbln_retrieval.local.device import device_scope, resolve_device

# How long a holder another process started may take to answer (an NPU compile included) before the error names it.
ATTACH_TIMEOUT_SECONDS = 1800.0
# How long a holder that accepted a connection may take to answer it (its threads share one interpreter with the
# engine's, on a loaded machine) before it counts as not answering.
PING_TIMEOUT_SECONDS = 30.0
_POLL_SECONDS = 0.2
# The holders this process started: kept so their Popen objects are never collected while the holders run on.
_started: list[subprocess.Popen[bytes]] = []


def shares_across_processes(options: EngineOptions) -> bool:
    """Whether a framework object's local engine of ``options`` is shared across processes (the module's rule)."""
    setting = share_setting()
    if setting is not None:
        return setting
    if (options.engine_kwargs.get("additional_config") or {}).get("rbln_retrieval", {}).get("compile_only"):
        return False  # compiling builds graphs on a host that may have no NPU; nothing is loaded to share
    return options.device == "rbln" or (options.device == "auto" and resolve_device("auto") == "rbln")


def attached_engine(model: LocalModel) -> AttachedEngine:
    """The engine PoolingEngine(model) would be, run by its holder (started now if there is none). Called as an
    EngineSpec's engine, so a process attaches once per model and options, however many objects share it."""
    from rbln_retrieval.local.engine import PoolingEngine

    spec = EngineSpec(PoolingEngine, model)
    files = EngineFiles.for_key((*spec.key(), device_scope()))  # the holder runs on the NPUs its starter may use
    lease = lock(files.path("lease"), fcntl.LOCK_SH)  # waits while a holder without clients exits
    try:
        info = _connect_or_start(spec, files)
    except BaseException:
        os.close(lease)
        raise
    return AttachedEngine(spec, files, lease, info)


def _answering(files: EngineFiles) -> dict[str, Any] | None:
    """The holder's record when it answers on its socket, else None."""
    info = files.read_info()
    if info is None or not info.get("ready"):
        return None
    try:
        connection = Client(info["socket"], "AF_UNIX")
    except OSError:
        return None
    with connection:
        try:
            connection.send((PING, (), {}))
            if not connection.poll(PING_TIMEOUT_SECONDS):  # a stopped or hung holder accepts, but never answers
                return None
            connection.recv()
        except (OSError, EOFError):
            return None
    return info


def _connect_or_start(spec: EngineSpec, files: EngineFiles) -> dict[str, Any]:
    info = _answering(files)
    if info is not None:
        return info
    with locked(files.path("start"), fcntl.LOCK_EX):  # one process starts the holder; the others wait, then attach
        deadline = time.monotonic() + ATTACH_TIMEOUT_SECONDS
        while files.holder_alive():  # a holder another process started and left: it may still be loading
            info = _answering(files)
            if info is not None:
                return info
            if time.monotonic() > deadline:
                raise RuntimeError(_unanswered(spec, files))
            time.sleep(_POLL_SECONDS)
        return _start_holder(spec, files)


def _start_holder(spec: EngineSpec, files: EngineFiles) -> dict[str, Any]:
    """Start a holder for ``spec`` and wait until it answers; its start's error is raised here."""
    files.path("error").unlink(missing_ok=True)
    with open(os.open(files.path("log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
        holder = subprocess.Popen(
            [sys.executable, "-m", "rbln_retrieval.frameworks.holder", str(files.stem)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # outlives this process; a Ctrl-C in this terminal does not reach it
        )
    _started.append(holder)
    assert holder.stdin is not None
    with holder.stdin:
        pickle.dump(spec, holder.stdin)
    while True:
        info = _answering(files)
        if info is not None and info["pid"] == holder.pid:
            return info
        if holder.poll() is not None:
            error = files.path("error")
            if error.exists():
                raise pickle.loads(error.read_bytes())
            raise RuntimeError(
                f"The shared engine's holder for {spec.model} exited with status {holder.returncode} before it "
                f"answered; its log is {files.path('log')}."
            )
        time.sleep(_POLL_SECONDS)


def _unanswered(spec: EngineSpec, files: EngineFiles) -> str:
    info = files.read_info() or {}
    return (
        f"The engine for {spec.model} is held by process {info.get('pid', '(unknown)')} "
        f"(`{info.get('command', 'python -m rbln_retrieval.frameworks.holder')}`), which has not answered on "
        f"{files.socket} for {ATTACH_TIMEOUT_SECONDS:.0f} s; stop that process, or set {SHARE_ENV}=0 to run the "
        "model in this process, or run `rbln-retrieval serve MODEL` and pass its URL as base_url."
    )


class AttachedEngine:
    """The engine API (that of PoolingEngine: embed, score, rerank, their async forms, the image calls, family,
    dimension, stats()...) of an engine another process holds. Thread-safe: each concurrent call uses a
    connection of its own. ``close()`` ends this process's lease."""

    def __init__(self, spec: EngineSpec, files: EngineFiles, lease: int, info: dict[str, Any]):
        self.spec = spec
        self.files = files
        self.model = str(spec.model)
        self._lease: int | None = lease
        self._info = info
        self._idle: queue.SimpleQueue[Connection] = queue.SimpleQueue()
        self._reattach = threading.Lock()

    @property
    def holder_pid(self) -> int:
        """The pid of the process that holds the engine now."""
        return int(self._info["pid"])

    @property
    def closed(self) -> bool:
        return self._lease is None

    def close(self) -> None:
        lease, self._lease = self._lease, None
        while not self._idle.empty():
            self._idle.get().close()
        if lease is not None:
            os.close(lease)

    def _connection(self, info: dict[str, Any]) -> Connection:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return Client(info["socket"], "AF_UNIX")

    def _call(self, name: str, *args: Any, **options: Any) -> Any:
        """``name(*args, **options)`` run by the holder; sent once more to a new holder when this one is gone."""
        if self._lease is None:
            raise RuntimeError(f"The attached engine for {self.model} was closed.")
        args = tuple(_sendable(arg) for arg in args)
        for attempt in range(2):
            info = self._info
            try:
                connection = self._connection(info)
                connection.send((name, args, options))
                ok, value = connection.recv()
            except (OSError, EOFError):
                if attempt:
                    raise
                self._attach_again(info)
                continue
            self._idle.put(connection)
            if ok:
                return value
            raise value
        raise AssertionError("unreachable")

    def _attach_again(self, seen: dict[str, Any]) -> None:
        """Drop the gone holder's connections and attach to (or start) its successor, once for all threads."""
        with self._reattach:
            if self._info is not seen:  # another thread has attached again meanwhile
                return
            while not self._idle.empty():
                self._idle.get().close()
            self._info = _connect_or_start(self.spec, self.files)

    def embed(self, texts: Iterable[str], **options: Any) -> Any:
        return self._call("embed", texts, **options)

    async def aembed(self, texts: Iterable[str], **options: Any) -> Any:
        return await asyncio.to_thread(self._call, "embed", _sendable(texts), **options)

    def score(self, query: str, documents: Iterable[str], **options: Any) -> list[float]:
        result: list[float] = self._call("score", query, documents, **options)
        return result

    async def ascore(self, query: str, documents: Iterable[str], **options: Any) -> list[float]:
        result: list[float] = await asyncio.to_thread(self._call, "score", query, _sendable(documents), **options)
        return result

    def rerank(self, query: str, documents: Iterable[str], **options: Any) -> list[tuple[int, float]]:
        result: list[tuple[int, float]] = self._call("rerank", query, documents, **options)
        return result

    async def arerank(self, query: str, documents: Iterable[str], **options: Any) -> list[tuple[int, float]]:
        result: list[tuple[int, float]] = await asyncio.to_thread(
            self._call, "rerank", query, _sendable(documents), **options
        )
        return result

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name.startswith("a") and name[1:] in _ASYNC_IMAGE_CALLS:
            sync = functools.partial(self._call, name[1:])

            async def call(*args: Any, **options: Any) -> Any:
                return await asyncio.to_thread(sync, *(_sendable(arg) for arg in args), **options)

            return call
        value = self._call(GETATTR, name)
        return functools.partial(self._call, name) if isinstance(value, str) and value == CALLABLE else value

    def __repr__(self) -> str:
        return f"AttachedEngine({self.model!r}, holder pid {self._info.get('pid')})"


_ASYNC_IMAGE_CALLS = ("embed_images", "score_images", "rerank_images")


def _sendable(value: Any) -> Any:
    """An iterable argument (a generator of texts or images) as a list: it crosses the socket whole."""
    if isinstance(value, (str, bytes, dict, list, tuple)) or not isinstance(value, Iterable):
        return value
    return list(value)
