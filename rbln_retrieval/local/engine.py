"""PoolingEngine: embeddings, relevance scores and reranking on vLLM's V1 pooling engine, run inside this process
(rbln_retrieval.local.inproc) or as vLLM's AsyncLLM with its engine processes. The calls take the typed options of
rbln_retrieval.engines.requests; how a query scores is decided by rbln_retrieval.engines.scoring (as for a remote
engine), which asks this engine's embedding and pair-scoring steps, and long texts' windows are pooled through
rbln_retrieval.engines.windows.

Imports: backend (compile_only), engines, local, models, results, text; vLLM inside the calls that build its requests.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Iterable, Sized
from dataclasses import replace
from typing import Any, TypeVar, Unpack

import numpy as np
from tqdm.auto import tqdm

from rbln_retrieval import backend
from rbln_retrieval.engines.loop import EngineLoop
from rbln_retrieval.engines.options import EngineOptions, LocalModel, local_model
from rbln_retrieval.engines.requests import (
    EmbedOptions,
    EmbedRequest,
    RerankOptions,
    RerankRequest,
    ScoreOptions,
    ScoreRequest,
    check_no_timeout,
)
from rbln_retrieval.engines.scoring import Scorer, score
from rbln_retrieval.engines.shared import EngineHandle, EngineSpec, close_all, close_at_exit
from rbln_retrieval.engines.windows import embed_windowed
from rbln_retrieval.local.device import resolve_device
from rbln_retrieval.local.engine_args import resolve_dtype
from rbln_retrieval.local.image_calls import ImageEmbedding
from rbln_retrieval.local.pair_calls import PairScoring, off_loop
from rbln_retrieval.local.vllm_calls import encode, start_vllm
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.source import SOURCE_ARGS, ModelSource
from rbln_retrieval.results.finite import check_finite
from rbln_retrieval.results.outputs import (
    SpecialTokens,
    activation,
    assemble,
    check_outputs,
    pooling_tasks,
)
from rbln_retrieval.results.quantize import quantizer
from rbln_retrieval.results.ranking import rank
from rbln_retrieval.text.chunks import embed_windows
from rbln_retrieval.text.inputs import Truncate, check_dimensions, check_truncate, chunking, chunks
from rbln_retrieval.text.prompts import embed_prefix
from rbln_retrieval.text.tokens import PromptTokenizer

logger = logging.getLogger(__name__)

T = TypeVar("T")


class PoolingEngine(ImageEmbedding, PairScoring):
    """One vLLM pooling engine for one model: ``embed``, ``score`` and ``rerank``, sync and async; for image-text
    models also ``embed_images``, ``score_images`` and ``rerank_images`` (local/image_calls.py).

    ``model`` is a local directory or a Hugging Face id (``"org/name"`` or ``"org/name@revision"``) resolved
    through huggingface_hub's cache with ``revision``, ``cache_folder``, ``token`` and ``local_files_only``.
    ``truncate`` is the default of this object's calls; each call may pass its own.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | ModelSource | LocalModel,
        *,
        truncate: Truncate = "end",
        revision: str | None = None,
        cache_folder: str | os.PathLike[str] | None = None,
        token: str | None = None,
        local_files_only: bool = False,
        **options: Any,
    ):
        self.truncate = check_truncate(truncate)
        source_args = {"revision": revision, "cache_folder": cache_folder, "token": token}
        if isinstance(model, LocalModel):  # resolved by the entry point that made it (get_engine, shared, serve)
            given = [*options, *(name for name, value in source_args.items() if value is not None)]
            if local_files_only:
                given.append("local_files_only")
            if given:
                raise ValueError(f"{', '.join(given)} cannot be given beside a LocalModel, which carries its options.")
            resolved = model
        else:
            resolved = local_model(model, EngineOptions(**options), local_files_only=local_files_only, **source_args)
        self.options, self.source, self.family = resolved.options, resolved.source, resolved.family
        self.model = self.source.path
        self.options.target(self.options.device)  # refuses runner="stock" on device="rbln" before any work
        self.device = resolve_device(self.options.device, compile_only=backend.compile_only(self.options.engine_kwargs))
        self.target = self.options.target(self.device)
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
        return EngineHandle(
            EngineSpec(PoolingEngine, local_model(model, EngineOptions(**options), **source_args)), truncate=truncate
        )

    @staticmethod
    def close_all() -> None:
        """Close every shared engine (registered at exit so engine processes never outlive the program)."""
        close_all()

    @property
    def closed(self) -> bool:
        return self._vllm is None and self._loop.loop.is_closed()

    async def _start(self) -> None:
        self._vllm = await start_vllm(
            self.model,
            family=self.family,
            options=self.options,
            device=self.device,
            target=self.target,
            source=self.source,
        )
        close_at_exit(self)

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
        return dict(stats)

    @property
    def errored(self) -> bool:
        """Whether vLLM's engine died under this object (its next call starts a new one; a server exits instead)."""
        return self._vllm is not None and bool(self._vllm.errored)

    @property
    def dimension(self) -> int:
        return self.family.pool.hidden_size

    @property
    def dtype(self) -> str:
        """The compute dtype ``dtype="auto"`` resolved to on the CPU ("float32" or "bfloat16"; on an NPU, the
        option as given): the bounds of rbln_retrieval.results.precision apply to it."""
        return resolve_dtype(self.options.dtype, self.device)

    # -- public API, sync and async (the options: rbln_retrieval.engines.requests) ----------------------------
    def embed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any:
        """Vectors for ``texts`` as a float32 array of shape (n, d), rows in input order. ``truncate`` (None: this
        object's default) decides what happens to texts over ``max_length``: "end" keeps the start, "start" keeps
        the end and the prompt, "error" raises naming the index, "chunk" embeds windows (rbln_retrieval.text.chunks).
        ``output`` (a model with sparse and multi-vector heads): "sparse" gives one {token_id: weight} dict per text,
        "multi_vector" one float32 (tokens, d) array per text; a list of outputs gives {output: result} (dense and
        sparse from one forward; see rbln_retrieval.results.outputs). Late-interaction checkpoints give
        "multi_vector" only, sparse ones "sparse" only (each family's outputs: docs/models.md). ``precision``
        (dense only) quantizes the vectors as sentence-transformers' ``quantize_embeddings`` does; int8/uint8 take
        ``ranges`` (2, d) or ``calibration_embeddings`` (rbln_retrieval.results.quantize). The other options and
        their defaults: EmbedRequest."""
        request = EmbedRequest(**options)
        quantize, truncate = self._embed_call(request)
        return quantize(self._loop.run(self._embed_any(texts, request, truncate=truncate)))

    async def aembed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any:
        request = EmbedRequest(**options)
        quantize, truncate = self._embed_call(request)
        return quantize(await self._loop.arun(self._embed_any(texts, request, truncate=truncate)))

    def score(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]:
        """Relevance of each document to ``query``: P(relevant) for rerankers, cosine for bi-encoders; with
        ``output="multi_vector"`` (a model with a multi-vector head) late interaction, MaxSim over the multi-vectors.
        Late-interaction checkpoints score by MaxSim whatever ``output`` says (token vectors are all they give),
        sparse ones by the dot product of sparse vectors (rbln_retrieval.engines.scoring)."""
        return self._loop.run(self._score(query, documents, ScoreRequest(**options)))

    async def ascore(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]:
        return await self._loop.arun(self._score(query, documents, ScoreRequest(**options)))

    def rerank(self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]) -> list[tuple[int, float]]:
        """(index, score) pairs, best first; ``top_n`` None keeps all, 0 or less returns []."""
        request = RerankRequest(**options)
        return rank(self._loop.run(self._score(query, documents, request)), request.top_n)

    async def arerank(
        self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]
    ) -> list[tuple[int, float]]:
        request = RerankRequest(**options)
        return rank(await self._loop.arun(self._score(query, documents, request)), request.top_n)

    def _truncate(self, truncate: Truncate | None, precision: str = "float32") -> Truncate:
        return check_truncate(self.truncate if truncate is None else truncate, precision)

    def _embed_call(self, request: EmbedRequest) -> tuple[Callable[[Any], Any], Truncate]:
        """(what to apply to the result, the call's truncation), every option checked before any work."""
        check_no_timeout("PoolingEngine", request.timeout)
        quantize = quantizer(
            request.precision,
            request.ranges,
            request.calibration_embeddings,
            output=request.output,
            dim=request.dimensions or self.dimension,
        )
        return quantize, self._truncate(request.truncate, request.precision)

    # -- implementation (runs on the engine loop) --------------------------------------------------------------
    async def _embed_any(
        self, texts: Iterable[str], request: EmbedRequest, *, truncate: Truncate, what: str = "texts"
    ) -> Any:
        prefix = embed_prefix(self.family, self.model, request.kind, request.instruction)
        if chunked := chunking(truncate):  # windows of an over-long text, each embedded as a text that fits
            windows = embed_windows(self.tokenizer, prefix, chunked)
            quiet = replace(request, show_progress=False)

            async def embed(pieces: list[str]) -> np.ndarray:
                return await self._embed(pieces, quiet, truncate="end")

            return await embed_windowed(
                windows, texts, chunked, normalize=request.normalize, embed=embed, output=request.output, what=what
            )
        output = request.output
        if isinstance(output, str) and output == "dense" and self.family.gives_dense:
            return await self._embed(texts, request, truncate=truncate, what=what)
        outputs = check_outputs(output, family=self.family.name, model=self.model, dimensions=request.dimensions)
        from vllm import PoolingParams

        tasks = {
            task: PoolingParams(task=task, use_activation=activation(task, request.normalize))
            for task in pooling_tasks(outputs, self.family.name)
        }
        special = SpecialTokens.of(self.tokenizer.hf, self.model)
        raw: dict[str, list[np.ndarray]] = {task: [] for task in tasks}
        ids: list[list[int]] = []
        with self._progress(texts, request.show_progress) as bar:
            for first, chunk in chunks(texts, what):
                tokens = await off_loop(chunk, self.tokenizer.encode_texts, chunk, prefix, truncate, first_index=first)
                ids.extend(t.ids for t in tokens)
                rows = await asyncio.gather(*(self._encode(tokens, p, stack=False) for p in tasks.values()))
                for task, task_rows in zip(tasks, rows):
                    raw[task].extend(task_rows)
                bar.update(len(chunk))
        parts = assemble(
            outputs,
            raw,
            ids,
            hidden_size=self.dimension,
            normalize=request.normalize,
            special=special,
            family=self.family.name,
        )
        return parts[output] if isinstance(output, str) else parts

    async def _embed(
        self, texts: Iterable[str], request: EmbedRequest, *, truncate: Truncate, what: str = "texts"
    ) -> np.ndarray:
        prefix = embed_prefix(self.family, self.model, request.kind, request.instruction)
        params = self._embed_params(request)
        rows: list[np.ndarray] = []
        with self._progress(texts, request.show_progress) as bar:
            for first, chunk in chunks(texts, what):
                tokens = await off_loop(chunk, self.tokenizer.encode_texts, chunk, prefix, truncate, first_index=first)
                rows.extend(await self._encode(tokens, params, bar=bar))
        return self._stacked(rows, params.dimensions, what)

    async def aembed_ids(self, ids: list[list[int]], **options: Unpack[EmbedOptions]) -> Any:
        """Dense vectors of token ids as given (the model's own ids, special tokens included, as vLLM's
        /v1/embeddings embeds them), each over max_length cut per ``truncate`` ("end" keeps its start, "start" its
        end, "error" refuses it naming its index); an id outside the vocabulary is the caller's to refuse."""
        request = EmbedRequest(**options)
        quantize, truncate = self._embed_call(request)
        if truncate not in ("end", "start", "error"):
            raise ValueError(f"aembed_ids takes truncate='end', 'start' or 'error', not {truncate!r}.")
        if request.output != "dense":
            raise ValueError(f"aembed_ids gives dense vectors only, not output={request.output!r}.")
        params = self._embed_params(request)
        tokens = self.tokenizer.cut_ids(ids, str(truncate))
        rows = await self._loop.arun(self._encode(tokens, params)) if tokens else []
        return quantize(self._stacked(list(rows), params.dimensions, "input"))

    def _embed_params(self, request: EmbedRequest) -> Any:
        dimensions = check_dimensions(
            request.dimensions,
            hidden_size=self.dimension,
            matryoshka=self.family.output.matryoshka,
            model=self.model,
            sizes=self.family.output.matryoshka_dimensions,
        )
        from vllm import PoolingParams

        return PoolingParams(task="embed", use_activation=request.normalize, dimensions=dimensions)

    def _stacked(self, rows: list[np.ndarray], dimensions: int | None, what: str) -> np.ndarray:
        if not rows:
            return np.zeros((0, dimensions or self.dimension), dtype=np.float32)
        vectors = np.stack(rows).astype(np.float32, copy=False)
        check_finite(vectors, what)
        return vectors

    def _score(self, query: str, documents: Iterable[str], request: ScoreRequest) -> Coroutine[Any, Any, list[float]]:
        """The call's work on the engine loop, its options checked first."""
        check_no_timeout("PoolingEngine", request.timeout)
        truncate = self._truncate(request.truncate)
        scorer = Scorer(
            model=self.model,
            family=self._family,
            tokenizer=self._tokenizer,
            check_outputs=check_outputs,
            embed=self._embed_any,
            score_pairs=self._score_pairs,
            score_template=self._score_template,
        )
        return score(scorer, query, documents, request=request, truncate=truncate)

    async def _family(self) -> ModelFamily:
        return self.family

    async def _tokenizer(self, family: ModelFamily) -> PromptTokenizer:
        return self.tokenizer

    async def _encode(self, tokens: list[Any], params: Any, *, bar: tqdm | None = None, stack: bool = True) -> Any:
        return await encode(await self._running_engine(), self.model, tokens, params=params, bar=bar, stack=stack)

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
        total = len(texts) if isinstance(texts, Sized) else None
        return tqdm(total=total, disable=not show_progress, desc="Embedding", unit="text")
