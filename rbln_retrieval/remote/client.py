"""RemoteEngine: the PoolingEngine API against `rbln-retrieval serve` replicas (vLLM's OpenAI-compatible server).

The client learns the served model's family from the server (rbln_retrieval.remote.served_model), applies prompts
and templates exactly as local mode does and sends raw text: remote results equal local ones. Inputs are cut into
batches sent concurrently through rbln_retrieval.remote.replicas (spread over the healthy replicas, retried elsewhere
with backoff), so every input gets exactly one result, in input order, or the call raises. Batches are also cut
under the server's advertised request-size bounds, and vectors travel as base64 float32 (vLLM's
``encoding_format="base64"``): fewer bytes than JSON's decimal floats, and decoded by numpy instead of parsed
(bench/wire_format.py compares the two; bench/results/wire_format.json). Scores are decided by
rbln_retrieval.engines.scoring, as a local engine's.

Imports: engines (options, protocol, requests, scoring, windows), models (families), remote (answers, calls,
image_calls, replicas, served_model), results (finite, outputs, quantize, ranking), text (chunks, inputs, prompts);
numpy.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import replace
from typing import Any, TypeVar, Unpack

import numpy as np

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, OUTPUTS_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.engines.requests import (
    EmbedOptions,
    EmbedRequest,
    RerankOptions,
    RerankRequest,
    ScoreOptions,
    ScoreRequest,
)
from rbln_retrieval.engines.scoring import Scorer, score
from rbln_retrieval.engines.windows import embed_windowed
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.remote.answers import output_rows, quantized_rows, score_rows, vector_rows
from rbln_retrieval.remote.calls import RemoteClosedError
from rbln_retrieval.remote.image_calls import RemoteImageEmbedding
from rbln_retrieval.remote.replicas import Deadline, RemoteAuthError, RemoteError, Replicas
from rbln_retrieval.remote.served_model import RemoteModel
from rbln_retrieval.results.finite import check_finite, finite_scores
from rbln_retrieval.results.outputs import Output, check_outputs, check_remote_outputs
from rbln_retrieval.results.quantize import check_precision, quantization_ranges, quantizer, resolve_ranges
from rbln_retrieval.results.ranking import rank
from rbln_retrieval.text.chunks import embed_windows
from rbln_retrieval.text.inputs import Truncate, check_dimensions, check_truncate, chunking, chunks
from rbln_retrieval.text.prompts import embed_prefix

__all__ = ["DESCRIBE_PATH", "RemoteAuthError", "RemoteEngine", "RemoteError"]

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
# vLLM's embeddings in base64: little-endian float32, exact, decoded with numpy instead of JSON's float parsing.
BASE64_FLOAT32 = {"encoding_format": "base64", "embed_dtype": "float32", "endianness": "little"}

# The deadline of the call in progress (None: no call timeout, each request gets the client's), seen by every
# request the call makes.
_call_deadline: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("rbln_remote_deadline", default=None)


class RemoteEngine(RemoteImageEmbedding):
    """``embed``/``score``/``rerank`` (sync and async) served by one or more remote replicas.

    The model's family comes from the server's description; an explicit ``family`` must agree with it and is used
    where the server gives none (a plain vLLM server). ``truncate`` and ``timeout`` are defaults of each call: a
    timeout bounds the whole call (every request, retry, backoff and wait for a busy server); without one, each
    request gets DEFAULT_TIMEOUT for all its attempts, so a long ingest is not cut short.
    ``max_in_flight`` requests per replica are sent at once (fewer if the server's limit is lower); the rest wait
    here, not in the server's queue. The engine options come as keywords or, built once by the caller
    (``get_engine``), as ``options``."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        base_url: str | list[str],
        api_key: str | None = None,
        timeout: float | None = None,
        batch_size: int = 64,
        max_retries: int = 3,
        max_in_flight: int = 8,
        revision: str | None = None,
        cache_folder: str | os.PathLike[str] | None = None,
        token: str | None = None,
        local_files_only: bool = False,
        truncate: Truncate = "end",
        verify: bool | str = True,
        options: EngineOptions | None = None,
        **engine_options: Any,
    ):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"base_url must be an http(s) URL or a non-empty list of them, got {base_url!r}.")
        if batch_size < 1 or max_in_flight < 1:
            raise ValueError(f"batch_size={batch_size} and max_in_flight={max_in_flight} must be at least 1.")
        self.model = str(model)
        self.truncate = check_truncate(truncate)
        if options is not None and engine_options:
            raise ValueError(f"{', '.join(engine_options)} cannot be given beside options=EngineOptions(...).")
        self.options = options if options is not None else EngineOptions(**engine_options)
        self._replicas = Replicas(
            urls,
            api_key=api_key if api_key is not None else os.environ.get("RBLN_API_KEY"),
            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,  # per request, for calls without a timeout
            max_retries=max_retries,
            verify=verify,
            max_in_flight=max_in_flight,
        )
        self._batch_size = batch_size
        super().__init__("rbln-retrieval-remote")
        source_args = {
            "revision": revision,
            "cache_folder": cache_folder,
            "token": token,
            "local_files_only": local_files_only,
        }
        self._remote = RemoteModel(self.model, self.options, self._replicas, source_args)
        self._timeout = timeout

    @property
    def family(self) -> ModelFamily:
        """The served model's family, read from the server on first use."""
        known = self._remote.family
        return known if known is not None else self._run(self._call(None, self._described()))

    def __repr__(self) -> str:  # never shows the API key, nor credentials the base URLs held
        return f"RemoteEngine(model={self.model!r}, replicas={self._replicas.urls})"

    async def _aclose(self) -> None:
        await self._replicas.aclose()

    def _forget_connections(self) -> None:
        self._replicas.forget_connections()

    @property
    def dimension(self) -> int:
        if not self.family.pool.hidden_size:
            self._remote.family = self.family.replace(hidden_size=self.embed([""]).shape[1])
        return self.family.pool.hidden_size

    # -- public API (PoolingEngine's; the options: rbln_retrieval.engines.requests) ---------------------------
    def embed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any:
        request = EmbedRequest(**options)
        quantize, work = self._embed_call(texts, request)
        return quantize(self._run(self._call(request.timeout, work)))

    async def aembed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any:
        request = EmbedRequest(**options)
        quantize, work = self._embed_call(texts, request)
        return quantize(await self._arun(self._call(request.timeout, work)))

    def score(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]:
        request = ScoreRequest(**options)
        return self._run(self._call(request.timeout, self._score(query, documents, request)))

    async def ascore(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]:
        request = ScoreRequest(**options)
        return await self._arun(self._call(request.timeout, self._score(query, documents, request)))

    def rerank(self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]) -> list[tuple[int, float]]:
        request = RerankRequest(**options)
        return rank(self._run(self._call(request.timeout, self._score(query, documents, request))), request.top_n)

    async def arerank(
        self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]
    ) -> list[tuple[int, float]]:
        request = RerankRequest(**options)
        scores = await self._arun(self._call(request.timeout, self._score(query, documents, request)))
        return rank(scores, request.top_n)

    # -- implementation (on the client's loop) ------------------------------------------------------------------
    def _truncate(self, truncate: Truncate | None, precision: str = "float32") -> Truncate:
        return check_truncate(self.truncate if truncate is None else truncate, precision)

    def _embed_call(
        self, texts: Iterable[str], request: EmbedRequest
    ) -> tuple[Callable[[Any], Any], Coroutine[Any, Any, Any]]:
        """(what to apply to the answer, the call's work), every option checked first."""
        quantize, wire = self._quantizer(request)
        truncate = self._truncate(request.truncate, request.precision)
        return quantize, self._embed(texts, request, truncate=truncate, wire=wire)

    def _quantizer(self, request: EmbedRequest) -> Any:
        """(what to apply to the answer, what to ask a server for), every argument checked before any request where
        the vectors' width is known. An `rbln-retrieval serve` server quantizes and sends the quantized bytes (ranges
        travel, calibration embeddings never do); a plain vLLM server sends float32, quantized here."""
        precision, ranges, calibration, output = (
            request.precision,
            request.ranges,
            request.calibration_embeddings,
            request.output,
        )
        if check_precision(precision, ranges, calibration, output=output) == "float32":
            return (lambda rows: rows), None
        known = self._remote.family
        width = request.dimensions or (known.pool.hidden_size if known is not None else 0)
        if width:
            ranges = resolve_ranges(precision, ranges, calibration, width)
        elif calibration is not None:
            ranges = quantization_ranges(calibration)
        wire = {"precision": precision, "ranges": None if ranges is None else np.asarray(ranges).tolist()}

        def quantize(rows: np.ndarray) -> np.ndarray:  # rows arrive quantized from our server, float32 from vLLM's
            return (
                rows
                if rows.dtype != np.float32
                else quantizer(precision, ranges, None, output=output, dim=rows.shape[1])(rows)
            )

        return quantize, wire

    def _call(self, timeout: float | None, work: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """``work`` under the call's deadline, every argument checked first (``work`` closed if refused)."""
        if timeout is not None and not timeout > 0:
            work.close()
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds or None.")
        if self.closed:
            work.close()
            raise RemoteClosedError(f"{self!r} is closed; make a new one.")
        return self._under_deadline(self._timeout if timeout is None else timeout, work)

    @staticmethod
    async def _under_deadline(seconds: float | None, work: Coroutine[Any, Any, T]) -> T:
        # This task's context: the call's requests see the deadline (counted from here), other calls do not.
        _call_deadline.set(None if seconds is None else Deadline.after(seconds))
        return await work

    @staticmethod
    def _truncation(family: ModelFamily, truncate: Truncate) -> dict[str, Any]:
        if truncate == "error" or not family.tokens.max_length:
            return {}
        if truncate == "start":
            # vLLM then slices the token list, special tokens included: close to, not equal to, local "start".
            return {"truncate_prompt_tokens": family.tokens.max_length, "truncation_side": "left"}
        # Without a side vLLM truncates inside the tokenizer, which keeps special tokens as local mode does.
        return {"truncate_prompt_tokens": family.tokens.max_length}

    async def _embed(
        self,
        texts: Iterable[str],
        request: EmbedRequest,
        *,
        truncate: Truncate,
        wire: dict[str, Any] | None = None,
        what: str = "texts",
    ) -> Any:
        family = await self._described()  # never the sync property here: it would wait on this very loop
        if chunked := chunking(truncate):  # cut here with the model's tokenizer: the server embeds windows that fit
            prefix = embed_prefix(family, self.model, request.kind, request.instruction)
            windows = embed_windows(await self._remote.tokenizer(family), prefix, chunked)

            async def embed(pieces: list[str]) -> np.ndarray:  # float32 windows: the mean is quantized, if asked
                vectors: np.ndarray = await self._embed(pieces, request, truncate="end")
                return vectors

            return await embed_windowed(
                windows, texts, chunked, normalize=request.normalize, embed=embed, output=request.output, what=what
            )
        output = request.output
        if not (isinstance(output, str) and output == "dense") or not family.gives_dense:
            outputs = self._check_outputs(output, family=family.name, model=self.model, dimensions=request.dimensions)
            if self._remote.gives_outputs:
                return await self._outputs(texts, request, family, outputs, truncate=truncate, what=what)
            dense = replace(request, output="dense")
            return {outputs[0]: await self._embed(texts, dense, truncate=truncate, what=what)}
        dimensions = request.dimensions
        prefix = embed_prefix(family, self.model, request.kind, request.instruction)
        if family.pool.hidden_size:
            check_dimensions(
                dimensions,
                hidden_size=family.pool.hidden_size,
                matryoshka=family.output.matryoshka,
                model=self.model,
                sizes=family.output.matryoshka_dimensions,
            )
        payload: dict[str, Any] = {"use_activation": request.normalize, **self._truncation(family, truncate)}
        if dimensions is not None:
            payload["dimensions"] = dimensions
        prompts = [self._remote.fit(prefix + t, truncate) for _, chunk in chunks(texts, what) for t in chunk]
        if not prompts:
            return np.zeros((0, dimensions or family.pool.hidden_size), dtype=np.float32)

        width = dimensions or family.pool.hidden_size
        if wire is not None and self._remote.quantizes:
            return np.stack(await self._batched(prompts, lambda items: self._quantized(items, payload, wire, width)))

        async def batch(items: list[str]) -> list[np.ndarray]:
            return await self._embedding_rows({**payload, "input": items}, len(items), width)

        vectors = np.stack(await self._batched(prompts, batch)).astype(np.float32, copy=False)
        check_finite(vectors, what)
        return vectors

    def _check_outputs(
        self, output: Any, *, family: str, model: str, dimensions: int | None = None
    ) -> tuple[Output, ...]:
        """The outputs asked for, as a local engine checks them; token-level ones only from a server that gives them
        (`rbln-retrieval serve`), known once the replicas have described the model."""
        check = check_outputs if self._remote.gives_outputs else check_remote_outputs
        return check(output, family=family, model=model, dimensions=dimensions)

    async def _outputs(
        self,
        texts: Iterable[str],
        request: EmbedRequest,
        family: ModelFamily,
        outputs: tuple[Output, ...],
        *,
        truncate: Truncate,
        what: str,
    ) -> Any:
        """``outputs`` of each text from the server's OUTPUTS_PATH, as the local engine gives them: the prompt put
        in here (the server embeds the texts as given), in input order."""
        prefix = embed_prefix(family, self.model, request.kind, request.instruction)
        prompts = [self._remote.fit(prefix + t, truncate) for _, chunk in chunks(texts, what) for t in chunk]
        body = {"output": list(outputs), "normalize": request.normalize, "truncate": truncate}

        async def batch(items: list[str]) -> list[dict[str, Any]]:
            return await self._post(
                OUTPUTS_PATH, {**body, "input": items}, lambda a: output_rows(a, len(items), outputs)
            )

        rows = await self._batched(prompts, batch) if prompts else []
        parts: dict[str, Any] = {name: [row[name] for row in rows] for name in outputs}
        if "dense" in parts:
            width = family.pool.hidden_size
            parts["dense"] = np.stack(parts["dense"]) if rows else np.zeros((0, width), dtype=np.float32)
            check_finite(parts["dense"], what)
        for name in ("sparse", "multi_vector"):  # one flag per text, so the error names the text
            values = [np.fromiter(v.values(), float) if name == "sparse" else v for v in parts.get(name, [])]
            check_finite(np.array([[0.0 if np.isfinite(v).all() else np.nan] for v in values]), what)
        return parts[request.output] if isinstance(request.output, str) else parts

    async def _embedding_rows(self, body: dict[str, Any], count: int, width: int) -> list[np.ndarray]:
        """vLLM's /v1/embeddings answer to ``body`` (``count`` texts or images) as float32 rows of ``width`` (0:
        unknown) in input order."""
        return await self._post(
            "/v1/embeddings", {**body, **BASE64_FLOAT32}, lambda answer: vector_rows(answer, count, width=width)
        )

    async def _quantized(
        self, items: list[str], payload: dict[str, Any], wire: dict[str, Any], width: int
    ) -> list[np.ndarray]:
        """One batch's rows as our server quantizes them: each row's bytes, base64, in the dtype of the precision
        asked (``width``: the vectors' dimensions, 0 if unknown)."""
        precision = wire["precision"]
        return await self._post(
            QUANTIZED_EMBED_PATH,
            {**payload, **wire, "input": items},
            lambda answer: quantized_rows(answer, len(items), precision=precision, dimensions=width),
        )

    def _score(self, query: str, documents: Iterable[str], request: ScoreRequest) -> Coroutine[Any, Any, list[float]]:
        """The call's work on the client's loop, its options checked first."""
        truncate = self._truncate(request.truncate)
        scorer = Scorer(
            model=self.model,
            family=self._described,
            tokenizer=self._remote.tokenizer,
            # token-level outputs only from a server that gives them (vLLM's own gives dense vectors only)
            check_outputs=self._check_outputs,
            embed=self._embed,
            score_pairs=self._score_pairs,
            score_template=self._score_template,
        )
        return score(scorer, query, documents, request=request, truncate=truncate)

    async def _score_pairs(
        self, query: str, documents: Iterable[str], *, family: ModelFamily, instruction: str | None, truncate: Truncate
    ) -> list[float]:
        """A cross-encoder's scores from the server's /score route (it takes no instruction)."""
        cut = self._truncation(family, truncate)
        query = self._remote.fit(query, truncate)
        return await self._served_scores(
            "/score",
            [self._remote.fit(d, truncate) for _, chunk in chunks(documents, "documents") for d in chunk],
            body=lambda items: {"queries": query, "documents": items, **cut},
            field="score",
            reserve=len(json.dumps(query)),  # the query travels in every request: room kept for it
            per_item=len(query.encode()),  # and the server counts its tokens once per document
        )

    async def _score_template(
        self, query: str, documents: Iterable[str], *, family: ModelFamily, instruction: str | None, truncate: Truncate
    ) -> list[float]:
        """A template reranker's P(yes) from the server's /score route, which puts the query, each
        document and the instruction in the family's template as the local engine does."""
        cut = self._truncation(family, truncate)
        return await self._served_scores(
            "/score",
            [self._remote.fit(d, truncate) for _, chunk in chunks(documents, "documents") for d in chunk],
            body=lambda items: {"queries": query, "documents": items, "instruction": instruction, **cut},
            field="score",
            reserve=len(json.dumps(query)) + len(json.dumps(instruction)),
            per_item=len(query.encode()),  # the server counts the query's tokens once per document
        )

    async def _served_scores(
        self,
        path: str,
        items: list[str],
        *,
        body: Callable[[list[str]], dict[str, Any]],
        field: str,
        reserve: int = 0,
        per_item: int = 0,
    ) -> list[float]:
        """One finite score per item, in input order, from ``path``'s answers to the batches' ``body`` (each row's
        ``field``: answers.score_rows)."""
        if not items:
            return []

        async def batch(part: list[str]) -> list[float]:
            return await self._post(path, body(part), lambda answer: score_rows(answer, len(part), field))

        return finite_scores(await self._batched(items, batch, reserve=reserve, per_item=per_item))

    async def _batched(
        self,
        items: list[Any],
        call: Callable[[list[Any]], Awaitable[list[Any]]],
        reserve: int = 0,
        what: str = "",
        per_item: int = 0,
    ) -> list[Any]:
        """Run ``call`` over batches concurrently (spread over replicas) and concatenate in input order."""
        batches = self._remote.batches(items, self._batch_size, reserve, what, per_item)
        results = await asyncio.gather(*(call(b) for b in batches))  # each checked whole (remote.answers)
        return [row for result in results for row in result]

    async def _described(self) -> ModelFamily:
        return await self._remote.described(_call_deadline.get())

    async def _post(self, path: str, body: dict[str, Any], read: Callable[[Any], T]) -> T:
        """POST ``body`` for this model, under the deadline of the call in progress, its answer through ``read``."""
        return await self._remote.post(path, body, _call_deadline.get(), read)
