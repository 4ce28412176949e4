"""Process-wide shared engines, reference-counted: one engine per model and computation options (or per remote
server and model), held through ``EngineHandle`` claims. Releasing a claim never affects another holder; the
engine closes when its last claim is released, or at exit.

After ``os.fork()`` the child forgets the parent's engines (their loop threads exist only in the parent): a handle
used in the child acquires an engine of the child's own. A pickled handle carries only what identifies its engine
and acquires it on first use in the process that unpickles it.

Imports: engines (options, protocol, requests), models (families), text (inputs); no engine class: an EngineSpec names
the one it starts.
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Unpack

from rbln_retrieval.engines.options import EngineOptions, LocalModel
from rbln_retrieval.engines.protocol import RetrievalEngine
from rbln_retrieval.engines.requests import EmbedOptions, RerankOptions, ScoreOptions
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.text.inputs import Truncate, check_truncate

logger = logging.getLogger(__name__)

_Options = TypeVar("_Options", EmbedOptions, ScoreOptions, RerankOptions)


@dataclass(frozen=True)
class EngineSpec:
    """What identifies a shared engine: the kind of engine that serves it (PoolingEngine or RemoteEngine, named by
    whoever makes the spec, so this registry depends on neither), the model (a local engine's LocalModel carries its
    options and family; a remote client's model name or id comes with its options), and for a remote client the
    servers and key. Per-call behaviour (truncate, timeout, batch sizes, progress) is not part of it."""

    engine: Callable[..., RetrievalEngine]  # local: engine(model); remote: engine(model, options=, servers, key)
    model: LocalModel | str
    remote_options: EngineOptions | None = None  # a remote client's options; a LocalModel carries its own
    # Never in the repr: a base URL may hold a user and password, the client settings a Hugging Face token.
    base_url: tuple[str, ...] | None = field(default=None, repr=False)
    api_key: str | None = field(default=None, repr=False)
    client: dict[str, Any] = field(default_factory=dict, repr=False)  # transport (batch_size, ...) and source args

    @property
    def remote(self) -> bool:
        return self.base_url is not None

    @property
    def options(self) -> EngineOptions:
        if isinstance(self.model, LocalModel):
            return self.model.options
        if self.remote_options is None:
            raise ValueError(f"The spec of the remote engine for {self.model} names no options.")
        return self.remote_options

    @property
    def family(self) -> ModelFamily | None:
        """The local model's family, read by the entry point before any engine starts; None for a remote client
        (its server names the family)."""
        return self.model.family if isinstance(self.model, LocalModel) else None

    def key(self) -> tuple[Any, ...]:
        options = self.options.model_dump_json()
        if isinstance(self.model, LocalModel):
            return (self.engine, str(Path(self.model.path).resolve()), options)
        return (self.engine, self.model, self.base_url, self.api_key, options, repr(sorted(self.client.items())))

    def start(self) -> RetrievalEngine:
        if isinstance(self.model, LocalModel):
            return self.engine(self.model)
        assert self.base_url is not None, "a remote client's spec names its servers"
        return self.engine(
            self.model, base_url=list(self.base_url), api_key=self.api_key, options=self.options, **self.client
        )


@dataclass
class _Entry:
    engine: RetrievalEngine
    claims: int = 0


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[tuple[Any, ...], _Entry] = {}

    def acquire(self, spec: EngineSpec) -> RetrievalEngine:
        key = spec.key()
        with self.lock:  # engines start one at a time, so equal specs never start two engines
            entry = self.entries.get(key)
            if entry is None or entry.engine.closed:
                entry = self.entries[key] = _Entry(spec.start())
            entry.claims += 1
            return entry.engine

    def release(self, engine: RetrievalEngine) -> None:
        with self.lock:
            for key, entry in list(self.entries.items()):
                if entry.engine is engine:
                    entry.claims -= 1
                    if entry.claims > 0:
                        return
                    del self.entries[key]
        engine.close()

    def close_all(self) -> None:
        with self.lock:
            engines = [entry.engine for entry in self.entries.values()]
            self.entries.clear()
        for engine in engines:
            try:
                engine.close()
            except Exception:  # at exit, one engine's failure must not keep the others running
                logger.exception("Closing the engine for %s failed.", engine.model)

    def forget_after_fork(self) -> None:
        # The parent's engines are unusable here and a lock held by a parent thread would never be released.
        self.lock = threading.Lock()
        self.entries = {}


_registry = _Registry()
os.register_at_fork(after_in_child=_registry.forget_after_fork)
atexit.register(_registry.close_all)
_open_engines: weakref.WeakSet[Any] = weakref.WeakSet()
os.register_at_fork(after_in_child=_open_engines.clear)  # a child never closes its parent's engines


def close_at_exit(engine: Any) -> None:
    """Close ``engine`` at exit if the program has not. Called after each engine start: atexit runs the newest hook
    first, so this runs before the exit hooks of multiprocessing and vLLM registered during that start, which would
    otherwise kill the engine's processes under it (vLLM then logs a dead engine's traceback as the program ends)."""
    _open_engines.add(engine)
    atexit.unregister(_close_open_engines)
    atexit.register(_close_open_engines)


def _close_open_engines() -> None:
    # vLLM logs its shutdown through handlers whose streams may be closed by now (pytest's capture, a closed pipe):
    # drop those messages rather than print a "Logging error" traceback for each after the program's last output.
    logging.raiseExceptions = False
    _registry.close_all()
    for engine in list(_open_engines):
        try:
            engine.close()
        except Exception:  # at exit, one engine's failure must not keep the others running
            logger.exception("Closing the engine for %s failed.", engine.model)
    # Collect the closed engines' cycles now: vLLM's AsyncLLM.__del__ shuts down again and fails once the
    # interpreter has torn its modules down.
    gc.collect()


def close_all() -> None:
    """Close every shared engine of this process (also registered at exit)."""
    _registry.close_all()


class EngineHandle:
    """One holder's claim on a shared engine, with the engine's ``embed``/``score``/``rerank`` API (sync and async,
    the options of rbln_retrieval.engines.requests) and the holder's per-call defaults (``truncate``; ``timeout`` for
    a remote engine, dropped for a local one). ``close()`` releases this claim only; other attributes (``family``,
    ``dimension``, ``stats()``...) are the engine's."""

    def __init__(
        self, spec: EngineSpec, *, truncate: Truncate = "end", timeout: float | None = None, attach: bool = True
    ):
        self.spec = spec
        self.truncate = check_truncate(truncate)
        self.timeout = timeout
        self._engine: RetrievalEngine | None = None
        self._pid: int | None = None
        self._closed = False
        if attach:
            self.engine  # noqa: B018 - start (or join) the engine now, so a bad model fails here

    @property
    def engine(self) -> RetrievalEngine:
        """The shared engine this handle holds in this process, acquired on first use (again after a fork)."""
        if self._closed:
            raise RuntimeError(f"This handle on {self.spec.model} was closed; get a new one to use the model again.")
        if self._engine is None or self._pid != os.getpid():
            self._engine = None  # a forked child's copy of the parent's claim: not ours to release
            self._engine, self._pid = _registry.acquire(self.spec), os.getpid()
        return self._engine

    def close(self) -> None:
        """Release this claim (idempotent); the engine closes when no other holder remains."""
        engine, self._engine, self._closed = self._engine, None, True
        if engine is not None and self._pid == os.getpid():
            _registry.release(engine)

    def __enter__(self) -> EngineHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, ...]:
        # Unpickled, the handle acquires the engine for the same spec in its own process on first use.
        return (_detached, (self.spec, self.truncate, self.timeout))

    def __repr__(self) -> str:  # the spec's repr leaves out the API key
        return f"EngineHandle({self.spec!r}, truncate={self.truncate!r})"

    def _call_options(self, options: _Options) -> _Options:
        """``options`` with this holder's defaults where the call gives none."""
        if options.get("truncate") is None:
            options["truncate"] = self.truncate
        if self.spec.remote:  # a local engine has no timeout: it computes, it does not wait on a server
            if options.get("timeout") is None:
                options["timeout"] = self.timeout
        else:
            options.pop("timeout", None)
        return options

    def embed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any:
        return self.engine.embed(texts, **self._call_options(options))

    async def aembed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any:
        return await self.engine.aembed(texts, **self._call_options(options))

    def score(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]:
        return self.engine.score(query, documents, **self._call_options(options))

    async def ascore(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]:
        return await self.engine.ascore(query, documents, **self._call_options(options))

    def rerank(self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]) -> list[tuple[int, float]]:
        return self.engine.rerank(query, documents, **self._call_options(options))

    async def arerank(
        self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]
    ) -> list[tuple[int, float]]:
        return await self.engine.arerank(query, documents, **self._call_options(options))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("spec", "_engine", "_pid", "_closed"):
            raise AttributeError(name)
        return getattr(self.engine, name)


def _detached(spec: EngineSpec, truncate: Truncate, timeout: float | None) -> EngineHandle:
    return EngineHandle(spec, truncate=truncate, timeout=timeout, attach=False)
