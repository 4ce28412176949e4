"""PoolingEngine: embeddings, relevance scores and reranking on vLLM's V1 pooling engine, run inside this process
(rbln_retrieval.inproc) or as vLLM's AsyncLLM with its engine processes."""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from tqdm.auto import tqdm

from rbln_retrieval.backend.config import compile_only
from rbln_retrieval.device import resolve_device
from rbln_retrieval.engine_args import cpu_threads_env, vllm_engine_kwargs
from rbln_retrieval.errors import EngineDeadError, EngineStartError
from rbln_retrieval.families import FamilyName, ModelFamily, check_weights, detect_family, unreadable_weights
from rbln_retrieval.inputs import Truncate, check_dimensions, check_query, check_sequence, check_texts, check_truncate
from rbln_retrieval.loop import EngineLoop
from rbln_retrieval.model_source import SOURCE_ARGS, ModelSource, resolve_model
from rbln_retrieval.shared import EngineHandle, EngineSpec, close_all
from rbln_retrieval.tokens import PromptTokenizer, Tokens

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Inputs are consumed, tokenized and submitted this many at a time, so an iterator of millions of texts
# holds only one chunk of prompts in memory while the engine works.
CHUNK_SIZE = 1024


class EngineOptions(BaseModel):
    """Everything that changes an engine's computation; equal options share one engine. Per-call behaviour
    (truncation, timeouts, batch sizes, progress) is an argument of each call instead, and where the files come
    from (revision, cache_folder, token, local_files_only) is named by the resolved snapshot directory (see
    rbln_retrieval.model_source)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Literal["auto", "rbln", "cpu"] = "auto"
    runner: Literal["bundled", "stock"] = "bundled"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_length: int | None = Field(default=None, gt=0)
    family: FamilyName | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    strict_shapes: bool = False
    # True: vLLM's engine runs in this process (rbln_retrieval.inproc): no processes to spawn, each re-importing
    # vLLM and torch, and no inter-process hop per step (all-MiniLM-L6-v2: first vector 7.8 s after process start
    # instead of about 27 s, bench/results). False: vLLM's AsyncLLM with its engine processes.
    in_process: bool = True
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)


def _vllm_quiet() -> None:
    # vLLM logs every start-up detail at INFO; users of a library want warnings only unless they ask.
    # vLLM warns about CPU-build details (Triton, tcmalloc) that are not actionable for a retrieval user.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


class PoolingEngine:
    """One vLLM pooling engine for one model: ``embed``, ``score`` and ``rerank``, sync and async.

    ``model`` is a local directory or a Hugging Face id (``"org/name"`` or ``"org/name@revision"``) resolved
    through huggingface_hub's cache with ``revision``, ``cache_folder``, ``token`` and ``local_files_only``.
    ``truncate`` is the default of this object's calls; each call may pass its own.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | ModelSource,
        *,
        truncate: Truncate = "end",
        revision: str | None = None,
        cache_folder: str | os.PathLike[str] | None = None,
        token: str | None = None,
        local_files_only: bool = False,
        **options: Any,
    ):
        self.truncate = check_truncate(truncate)
        self.options = EngineOptions(**options)
        self.source = resolve_source(model, self.options, revision=revision, cache_folder=cache_folder, token=token,
                               local_files_only=local_files_only)
        self.model = self.source.path
        self.family: ModelFamily = detect_family(
            self.model, max_length=self.options.max_length, family=self.options.family
        )
        check_weights(self.model, allow_pickle=self.options.allow_pickle)
        if self.options.runner == "stock" and self.options.device == "rbln":
            raise ValueError("runner='stock' is vLLM's CPU runner; device='rbln' needs runner='bundled'.")
        self.device = resolve_device(self.options.device, compile_only=compile_only(self.options.engine_kwargs))
        self.tokenizer = PromptTokenizer(self.model, self.family, trust_remote_code=self.options.trust_remote_code)
        self._loop = EngineLoop()
        self._vllm: Any = None
        self._restart = asyncio.Lock()  # one restart at a time when several calls find the engine dead
        try:
            self._loop.run(self._start())
        except BaseException:
            self._loop.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------------------------
    @staticmethod
    def shared(
        model: str | os.PathLike[str] | ModelSource, *, truncate: Truncate = "end", **options: Any
    ) -> EngineHandle:
        """A claim on the process-wide engine for ``model`` and ``options`` (those of the constructor), started by
        the first claim; its ``close()`` releases the claim, and the engine closes with its last claim or at exit.
        Keyed by the resolved directory, so every spelling of one snapshot (id, id@revision, the snapshot
        directory) shares one engine; the source options (token included) are not part of the key."""
        source_args = {name: options.pop(name) for name in SOURCE_ARGS if name in options}
        source = resolve_source(model, EngineOptions(**options), **source_args)
        return EngineHandle(EngineSpec(source, options), truncate=truncate)

    @staticmethod
    def close_all() -> None:
        """Close every shared engine (registered at exit so engine processes never outlive the program)."""
        close_all()

    @property
    def closed(self) -> bool:
        return self._vllm is None and self._loop.loop.is_closed()

    async def _start(self) -> None:
        _vllm_quiet()
        from rbln_retrieval import backend

        # The bundled plugin runs on the host on CPU engines and on the NPU on device="rbln"; vLLM's processes
        # started inside `activated` inherit the choice, and a stock engine's processes get the plugin off.
        target = ("rbln" if self.device == "rbln" else "host") if self.options.runner == "bundled" else None
        # An in-process engine uses this process's vLLM platform: the bundled one, if vLLM's CPU platform is active.
        in_process = self.options.in_process
        if in_process and not backend.claim_platform() and target is not None:
            logger.warning(
                "vLLM runs on another vendor's platform in this process; the bundled runner for %s runs in "
                "vLLM's engine processes instead (in_process=False).", self.model
            )
            in_process = False
        if not in_process and multiprocessing.current_process().daemon:
            # vLLM would fail deep inside with "daemonic processes are not allowed to have children".
            raise EngineStartError(
                f"vLLM could not start an engine for {self.model}: in_process=False runs it in child processes, "
                "which a daemonic process (a multiprocessing Pool worker) cannot start; use in_process=True there."
            )
        from vllm import AsyncEngineArgs, envs
        from vllm.v1.engine.async_llm import AsyncLLM

        from rbln_retrieval.inproc import InprocEngine

        kwargs = vllm_engine_kwargs(
            self.model,
            self.family,
            dtype=self.options.dtype,
            trust_remote_code=self.options.trust_remote_code,
            allow_pickle=self.options.allow_pickle,
            extra=self.options.engine_kwargs,
            runner=self.options.runner,
            target=target or "host",
            strict_shapes=self.options.strict_shapes,
            device=self.device,
            model_key=str(self.source),
        )
        if in_process:
            env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # vLLM's CPU platform allows the uni executor only then
        else:  # the thread variables reach only a worker process vLLM spawns
            env = cpu_threads_env() if self.device == "cpu" else {}
        try:
            with backend.activated(target, env):
                # An in-process engine freezes vLLM's variables for the whole process; this start reads them anew.
                envs.disable_envs_cache()
                if in_process:
                    self._vllm = await InprocEngine.start(AsyncEngineArgs(**kwargs))
                else:
                    self._vllm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        except Exception as exc:  # vLLM raises many types from deep inside; callers get one sentence.
            # A weights file that fails in vLLM's worker process only says "see root cause above" here.
            reason = unreadable_weights(self.model) or (
                str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            )
            raise EngineStartError(f"vLLM could not start an engine for {self.model}: {reason}") from exc

    def close(self) -> None:
        """Shut the engine down and free its memory; the object cannot be used afterwards."""
        if self._vllm is not None and not self._loop.loop.is_closed() and not self._loop.forked:
            self._loop.run(self._shutdown())
        self._loop.close()

    async def _shutdown(self) -> None:
        engine, self._vllm = self._vllm, None
        engine.shutdown()
        # Let the engine's output handler tasks observe their cancellation before the loop stops.
        pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def __enter__(self) -> PoolingEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """The model's identity (``{"id", "commit"}`` for a hub snapshot, else ``{"path"}``) and the bundled
        runner's counters since warmup: buckets, steps, useful/computed tokens, compiles, graph breaks (see
        rbln_retrieval.backend.runner); the stock runner keeps none and reports only its name."""
        if self.options.runner == "stock":
            return {"runner": "stock", "model": self.source.identity}
        return {**self._loop.run(self._stats()), "model": self.source.identity}

    async def _stats(self) -> dict[str, Any]:
        engine = await self._running_engine()
        (stats,) = await engine.collective_rpc("bundled_stats")
        return stats

    @property
    def dimension(self) -> int:
        return self.family.hidden_size

    # -- public sync API ---------------------------------------------------------------------------------------
    def embed(
        self,
        texts: Iterable[str],
        *,
        kind: Literal["document", "query"] = "document",
        instruction: str | None = None,
        dimensions: int | None = None,
        normalize: bool = True,
        show_progress: bool = False,
        truncate: Truncate | None = None,
    ) -> np.ndarray:
        """Vectors for ``texts`` as a float32 array of shape (n, d), rows in input order. ``truncate`` (None: this
        object's default) decides what happens to texts over ``max_length``: "end" keeps the start, "start" keeps
        the end and the prompt, "error" raises naming the index."""
        return self._loop.run(
            self._embed(texts, kind, instruction, dimensions, normalize, show_progress, self._truncate(truncate))
        )

    def score(
        self, query: str, documents: Iterable[str], *, instruction: str | None = None, truncate: Truncate | None = None
    ) -> list[float]:
        """Relevance of each document to ``query``: P(relevant) for rerankers, cosine for bi-encoders."""
        return self._loop.run(self._score(query, documents, instruction, self._truncate(truncate)))

    def rerank(
        self, query: str, documents: Iterable[str], *, top_n: int | None = None, instruction: str | None = None,
        truncate: Truncate | None = None,
    ) -> list[tuple[int, float]]:
        """(index, score) pairs, best first; ``top_n`` None keeps all, 0 or less returns []."""
        return _ranked(self.score(query, documents, instruction=instruction, truncate=truncate), top_n)

    # -- public async API --------------------------------------------------------------------------------------
    async def aembed(
        self,
        texts: Iterable[str],
        *,
        kind: Literal["document", "query"] = "document",
        instruction: str | None = None,
        dimensions: int | None = None,
        normalize: bool = True,
        show_progress: bool = False,
        truncate: Truncate | None = None,
    ) -> np.ndarray:
        return await self._loop.arun(
            self._embed(texts, kind, instruction, dimensions, normalize, show_progress, self._truncate(truncate))
        )

    async def ascore(
        self, query: str, documents: Iterable[str], *, instruction: str | None = None, truncate: Truncate | None = None
    ) -> list[float]:
        return await self._loop.arun(self._score(query, documents, instruction, self._truncate(truncate)))

    async def arerank(
        self, query: str, documents: Iterable[str], *, top_n: int | None = None, instruction: str | None = None,
        truncate: Truncate | None = None,
    ) -> list[tuple[int, float]]:
        return _ranked(await self.ascore(query, documents, instruction=instruction, truncate=truncate), top_n)

    def _truncate(self, truncate: str | None) -> Truncate:
        return self.truncate if truncate is None else check_truncate(truncate)

    # -- implementation (runs on the engine loop) --------------------------------------------------------------
    async def _embed(
        self,
        texts: Iterable[str],
        kind: str,
        instruction: str | None,
        dimensions: int | None,
        normalize: bool,
        show_progress: bool,
        truncate: Truncate,
        what: str = "texts",
    ) -> np.ndarray:
        if self.family.is_cross_encoder:
            raise ValueError(f"{self.model} is a reranker ({self.family.name}); it scores pairs and cannot embed.")
        if kind not in ("document", "query"):
            raise ValueError(f"kind={kind!r} is not 'document' or 'query'.")
        if instruction is not None and not isinstance(instruction, str):
            raise TypeError(f"instruction is {type(instruction).__name__}, expected str or None.")
        dimensions = check_dimensions(
            dimensions, hidden_size=self.dimension, matryoshka=self.family.matryoshka, model=self.model
        )
        prefix = self.family.query_prefix(instruction) if kind == "query" else self.family.document_prefix(instruction)
        from vllm import PoolingParams

        params = PoolingParams(task="embed", use_activation=normalize, dimensions=dimensions)
        rows: list[np.ndarray] = []
        with self._progress(texts, show_progress) as bar:
            for first, chunk in _chunks(texts, what):
                tokens = await _off_loop(chunk, self.tokenizer.encode_texts, chunk, prefix, truncate, first_index=first)
                rows.extend(await self._encode(tokens, params, bar))
        if not rows:
            return np.zeros((0, dimensions or self.dimension), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    async def _score(
        self, query: str, documents: Iterable[str], instruction: str | None, truncate: Truncate
    ) -> list[float]:
        query = check_query(query)
        if instruction is not None and not isinstance(instruction, str):
            raise TypeError(f"instruction is {type(instruction).__name__}, expected str or None.")
        if self.family.name == "bi-encoder" or self.family.name == "qwen3-embedding":
            docs = await self._embed(documents, "document", None, None, True, False, truncate, what="documents")
            if len(docs) == 0:
                return []
            q = await self._embed([query], "query", instruction, None, True, False, truncate)
            return [float(s) for s in docs @ q[0]]
        if instruction is not None and self.family.name == "cross-encoder":
            raise ValueError(f"{self.model} is a cross-encoder and takes no instruction; leave instruction unset.")
        from vllm import PoolingParams

        params = PoolingParams(task="classify", use_activation=True)
        scores: list[float] = []
        for first, chunk in _chunks(documents, what="documents"):
            if self.family.name == "qwen3-reranker":
                task = instruction if instruction is not None else self.family.default_instruction
                tokens = await _off_loop(
                    chunk, self.tokenizer.encode_qwen3_reranker, query, chunk, task, truncate, first_index=first
                )
            else:
                tokens = await _off_loop(chunk, self.tokenizer.encode_pairs, query, chunk, truncate, first_index=first)
            scores.extend(float(row.reshape(-1)[0]) for row in await self._encode(tokens, params, None))
        return scores

    async def _encode(self, tokens: list[Tokens], params: Any, bar: tqdm | None) -> np.ndarray:
        """Submit every prompt at once (the scheduler batches them) and return outputs in input order, one row
        each, as one array (a chunk of rows costs one allocation, not one tensor per row)."""
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError as VLLMEngineDeadError

        engine = await self._running_engine()
        batch = uuid.uuid4().hex

        async def one(index: int, item: Tokens) -> np.ndarray:
            request_params = params
            if item.type_ids is not None:
                from vllm.entrypoints.pooling.scoring.utils import compress_token_type_ids

                request_params = params.clone()
                request_params.extra_kwargs = {"compressed_token_type_ids": compress_token_type_ids(item.type_ids)}
            final = None
            async for output in engine.encode(TokensPrompt(prompt_token_ids=item.ids), request_params, f"{batch}-{index}"):
                final = output
            if bar is not None:
                bar.update(1)
            return final.outputs.data.float().numpy()

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i, t)) for i, t in enumerate(tokens)]
        except* VLLMEngineDeadError as failure:
            raise EngineDeadError(
                f"The vLLM engine for {self.model} died while serving this call; the next call starts a new one."
            ) from failure.exceptions[0]
        return np.stack([task.result() for task in tasks])

    async def _running_engine(self) -> Any:
        """The live engine (AsyncLLM or InprocEngine), restarting it first if it died."""
        async with self._restart:
            if self._vllm is not None and self._vllm.errored:
                logger.warning("The vLLM engine for %s died; starting a new one.", self.model)
                dead, self._vllm = self._vllm, None
                dead.shutdown()
            if self._vllm is None:
                await self._start()
            return self._vllm

    @staticmethod
    def _progress(texts: Iterable[str], show_progress: bool) -> tqdm:
        total = len(texts) if hasattr(texts, "__len__") else None
        return tqdm(total=total, disable=not show_progress, desc="Embedding", unit="text")


def resolve_source(model: str | os.PathLike[str] | ModelSource, options: EngineOptions, **source_args: Any) -> ModelSource:
    """The snapshot directory for ``model``, fetching only the files these options let the engine read."""
    return resolve_model(
        model, allow_pickle=options.allow_pickle, trust_remote_code=options.trust_remote_code, **source_args
    )


# Tokenizing this few texts (at most a window of each, see tokens.py) costs less than a hop to a worker thread.
INLINE_TOKENIZE = 4


async def _off_loop(chunk: list[str], fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, so the engine loop keeps serving other callers while a large
    chunk is tokenized; a chunk of a few texts (a query) is tokenized in place."""
    if len(chunk) <= INLINE_TOKENIZE:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def _chunks(texts: Iterable[str], what: str = "texts") -> Iterator[tuple[int, list[str]]]:
    """(index of first item, validated chunk) pairs; raises TypeError naming the global index of a bad item."""
    check_sequence(texts, what)
    iterator = iter(texts)
    first = 0
    while chunk := list(itertools.islice(iterator, CHUNK_SIZE)):
        yield first, check_texts(chunk, what, first_index=first)
        first += len(chunk)


def _ranked(scores: list[float], top_n: int | None) -> list[tuple[int, float]]:
    if top_n is not None and top_n <= 0:
        return []
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [(i, scores[i]) for i in order[:top_n]]

