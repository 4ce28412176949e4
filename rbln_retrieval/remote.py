"""RemoteEngine: the PoolingEngine API against `rbln-retrieval serve` replicas (vLLM's OpenAI-compatible server).

The server describes its model (family, prompts, dimensions, max length) on ``DESCRIBE_PATH``; the client reads it
once, so a client that has only the model's name applies prompts and templates exactly as local mode does and sends
raw text: remote results equal local ones. Inputs are cut into batches sent concurrently through
rbln_retrieval.replicas (spread over the healthy replicas, retried elsewhere with backoff), so every input gets
exactly one result, in input order, or the call raises.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.families import ModelFamily, detect_family
from rbln_retrieval.inputs import Truncate, check_dimensions, check_query, check_truncate, chunks
from rbln_retrieval.loop import EngineLoop
from rbln_retrieval.model_source import resolve_model, split_reference
from rbln_retrieval.options import EngineOptions
from rbln_retrieval.outputs import Output, check_remote_outputs
from rbln_retrieval.prompts import (
    default_document_prompt,
    default_instruction,
    default_query_prompt,
    embed_prefix,
    qwen3_reranker_prompts,
    score_method,
)
from rbln_retrieval.ranking import rank
from rbln_retrieval.replicas import RemoteAuthError, RemoteError, Replicas

__all__ = ["DESCRIBE_PATH", "RemoteAuthError", "RemoteEngine", "RemoteError"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
# Read-only route of `rbln-retrieval serve` describing the served model (rbln_retrieval.serve); under /v1, so the
# server's API key guards it like the rest of the API.
DESCRIBE_PATH = "/v1/rbln-retrieval/model"

# The timeout of the call in progress (None: the client's), seen by every request the call makes.
_call_timeout: contextvars.ContextVar[float | None] = contextvars.ContextVar("rbln_remote_timeout", default=None)


class RemoteEngine:
    """``embed``/``score``/``rerank`` (sync and async) served by one or more remote replicas.

    The model's family comes from the server's description; an explicit ``family`` must agree with it and is used
    where the server gives none (a plain vLLM server). ``truncate`` and ``timeout`` are defaults of each call."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        base_url: str | list[str],
        api_key: str | None = None,
        timeout: float | None = None,
        batch_size: int = 64,
        max_retries: int = 3,
        revision: str | None = None,
        cache_folder: str | os.PathLike[str] | None = None,
        token: str | None = None,
        local_files_only: bool = False,
        truncate: Truncate = "end",
        **options: Any,
    ):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"base_url must be an http(s) URL or a non-empty list of them, got {base_url!r}.")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1.")
        self.model = str(model)
        self.truncate = check_truncate(truncate)
        self.options = EngineOptions(**options)
        # Where a hub id's config files come from, for a server that does not describe its model.
        self._source_args: dict[str, Any] = {
            "revision": revision,
            "cache_folder": cache_folder,
            "token": token,
            "local_files_only": local_files_only,
        }
        self._replicas = Replicas(
            urls,
            api_key=api_key if api_key is not None else os.environ.get("RBLN_API_KEY"),
            timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
            max_retries=max_retries,
        )
        self._batch_size = batch_size
        self._loop = EngineLoop("rbln-retrieval-remote")
        self._served_model: str | None = None
        self._family: ModelFamily | None = None
        self._closed = False

    @property
    def family(self) -> ModelFamily:
        """The served model's family, read from the server on first use."""
        return self._family if self._family is not None else self._run(self._described())

    async def _described(self) -> ModelFamily:
        if self._family is None:
            answered, served = await self._server_family()
            if not answered:  # no replica up: the call fails in _post with the usual error; ask again next time
                return self._checked_family(None, warn=False)
            self._family = self._checked_family(served)
        return self._family

    async def _server_family(self) -> tuple[bool, ModelFamily | None]:
        """(whether a replica answered, the family it describes or None for a server without the route)."""
        answered, description = await self._replicas.get_first(DESCRIBE_PATH)
        if description is None:
            return answered, None
        try:
            return True, ModelFamily(**description["family"])
        except (KeyError, TypeError):  # not our description: as if no replica had answered
            return False, None

    def _checked_family(self, served: ModelFamily | None, warn: bool = True) -> ModelFamily:
        wanted = self.options.family
        if served is not None:
            if wanted is not None and wanted != served.name:
                raise ValueError(
                    f"family={wanted!r} was requested, but the server serves {self.model} as {served.name!r}."
                )
            if self.options.max_length and self.options.max_length != served.max_length:
                served = dataclasses.replace(served, max_length=min(served.max_length, self.options.max_length))
            return served
        try:
            source = resolve_model(self.model, weights=False, **self._source_args)
        except ModelNotSupportedError as exc:
            logger.info("%s Prompts come only from the family's defaults and explicit instructions.", exc)
        else:
            return detect_family(source.path, max_length=self.options.max_length, family=wanted)
        if wanted is None and warn:
            logger.warning(
                "The server does not describe %s and family is unset: treating it as a bi-encoder. Pass family= "
                "if it is a reranker or Qwen3-Embedding.",
                self.model,
            )
        # Without the model files, prompts come only from the family's defaults and explicit instructions.
        return ModelFamily(
            name=wanted or "bi-encoder",
            architecture="remote",
            hidden_size=0,
            max_length=self.options.max_length or 0,
            default_instruction=default_instruction(wanted or ""),
            query_prompt=default_query_prompt(wanted or ""),
            document_prompt=default_document_prompt(wanted or ""),
            matryoshka=wanted in ("qwen3-embedding", "nomic", "embeddinggemma"),
        )

    def __repr__(self) -> str:  # never shows the API key
        return f"RemoteEngine(model={self.model!r}, replicas={self._replicas.urls})"

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        if not self._loop.loop.is_closed() and not self._loop.forked:
            self._loop.run(self._replicas.aclose())
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        self._reconnect_after_fork()
        return self._loop.run(coro)

    async def _arun(self, coro: Coroutine[Any, Any, T]) -> T:
        self._reconnect_after_fork()
        return await self._loop.arun(coro)

    def _reconnect_after_fork(self) -> None:
        # A forked child has a copy of this client without the loop thread and with the parent's connections.
        if self._loop.forked and not self._closed:
            self._loop = EngineLoop("rbln-retrieval-remote")
            self._replicas.forget_connections()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def dimension(self) -> int:
        if not self.family.hidden_size:
            self._family = dataclasses.replace(self.family, hidden_size=self.embed([""]).shape[1])
        return self.family.hidden_size

    # -- public API (same signatures as PoolingEngine) ----------------------------------------------------------
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
        timeout: float | None = None,
        output: Output | Sequence[Output] = "dense",
    ) -> Any:
        return self._run(
            self._call(
                timeout,
                self._embed(texts, kind, instruction, dimensions, normalize, self._truncate(truncate), output=output),
            )
        )

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
        timeout: float | None = None,
        output: Output | Sequence[Output] = "dense",
    ) -> Any:
        return await self._arun(
            self._call(
                timeout,
                self._embed(texts, kind, instruction, dimensions, normalize, self._truncate(truncate), output=output),
            )
        )

    def score(
        self,
        query: str,
        documents: Iterable[str],
        *,
        instruction: str | None = None,
        truncate: Truncate | None = None,
        timeout: float | None = None,
        output: Literal["dense", "multi_vector"] = "dense",
    ) -> list[float]:
        return self._run(
            self._call(timeout, self._score(query, documents, instruction, self._truncate(truncate), output))
        )

    async def ascore(
        self,
        query: str,
        documents: Iterable[str],
        *,
        instruction: str | None = None,
        truncate: Truncate | None = None,
        timeout: float | None = None,
        output: Literal["dense", "multi_vector"] = "dense",
    ) -> list[float]:
        return await self._arun(
            self._call(timeout, self._score(query, documents, instruction, self._truncate(truncate), output))
        )

    def rerank(
        self,
        query: str,
        documents: Iterable[str],
        *,
        top_n: int | None = None,
        instruction: str | None = None,
        truncate: Truncate | None = None,
        timeout: float | None = None,
        output: Literal["dense", "multi_vector"] = "dense",
    ) -> list[tuple[int, float]]:
        scores = self.score(
            query, documents, instruction=instruction, truncate=truncate, timeout=timeout, output=output
        )
        return rank(scores, top_n)

    async def arerank(
        self,
        query: str,
        documents: Iterable[str],
        *,
        top_n: int | None = None,
        instruction: str | None = None,
        truncate: Truncate | None = None,
        timeout: float | None = None,
        output: Literal["dense", "multi_vector"] = "dense",
    ) -> list[tuple[int, float]]:
        scores = await self.ascore(
            query, documents, instruction=instruction, truncate=truncate, timeout=timeout, output=output
        )
        return rank(scores, top_n)

    # -- implementation (on the client's loop) ------------------------------------------------------------------
    def _truncate(self, truncate: str | None) -> Truncate:
        return self.truncate if truncate is None else check_truncate(truncate)

    @staticmethod
    async def _call(timeout: float | None, work: Coroutine[Any, Any, T]) -> T:
        if timeout is not None and not timeout > 0:
            work.close()
            raise ValueError(f"timeout={timeout!r} must be a positive number of seconds or None.")
        _call_timeout.set(timeout)  # this task's context: the call's requests see it, other calls do not
        return await work

    @staticmethod
    def _truncation(family: ModelFamily, truncate: Truncate) -> dict[str, Any]:
        if truncate == "error" or not family.max_length:
            return {}
        if truncate == "start":
            # vLLM then slices the token list, special tokens included: close to, not equal to, local "start".
            return {"truncate_prompt_tokens": family.max_length, "truncation_side": "left"}
        # Without a side vLLM truncates inside the tokenizer, which keeps special tokens as local mode does.
        return {"truncate_prompt_tokens": family.max_length}

    async def _embed(
        self,
        texts: Iterable[str],
        kind: str,
        instruction: str | None,
        dimensions: int | None,
        normalize: bool,
        truncate: Truncate,
        what: str = "texts",
        output: Any = "dense",
    ) -> Any:
        family = await self._described()  # never the sync property here: it would wait on this very loop
        if not (isinstance(output, str) and output == "dense") or family.late_interaction_only:
            outputs = check_remote_outputs(output, family=family.name, model=self.model)
            return {outputs[0]: await self._embed(texts, kind, instruction, dimensions, normalize, truncate, what)}
        prefix = embed_prefix(family, self.model, kind, instruction)
        if family.hidden_size:
            check_dimensions(
                dimensions,
                hidden_size=family.hidden_size,
                matryoshka=family.matryoshka,
                model=self.model,
                sizes=family.matryoshka_dimensions,
            )
        payload: dict[str, Any] = {"use_activation": normalize, **self._truncation(family, truncate)}
        if dimensions is not None:
            payload["dimensions"] = dimensions
        prompts = [prefix + t for _, chunk in chunks(texts, what) for t in chunk]
        if not prompts:
            return np.zeros((0, dimensions or family.hidden_size), dtype=np.float32)

        async def batch(items: list[str]) -> list[list[float]]:
            data = (await self._post_model("/v1/embeddings", {**payload, "input": items}))["data"]
            return [row["embedding"] for row in sorted(data, key=lambda row: row["index"])]

        return np.asarray(await self._batched(prompts, batch), dtype=np.float32)

    async def _score(
        self, query: str, documents: Iterable[str], instruction: str | None, truncate: Truncate, output: str = "dense"
    ) -> list[float]:
        query = check_query(query)
        family = await self._described()
        if output != "dense" or family.late_interaction_only:  # late interaction needs multi-vectors, not served
            late = "multi_vector" if output == "dense" else output
            check_remote_outputs(late, family=family.name, model=self.model)
        docs = [d for _, chunk in chunks(documents, "documents") for d in chunk]
        if not docs:
            return []
        method = score_method(family, self.model, instruction)
        if method == "cosine":
            doc_vectors = await self._embed(docs, "document", None, None, True, truncate, what="documents")
            query_vector = (await self._embed([query], "query", instruction, None, True, truncate))[0]
            return [float(s) for s in doc_vectors @ query_vector]
        if method == "qwen3-reranker":
            prompts = qwen3_reranker_prompts(family, query, docs, instruction)

            async def batch(items: list[str]) -> list[float]:
                body = {"input": items, "add_special_tokens": False, **self._truncation(family, truncate)}
                data = (await self._post_model("/classify", body))["data"]
                return [row["probs"][0] for row in sorted(data, key=lambda row: row["index"])]

            return [float(s) for s in await self._batched(prompts, batch)]

        async def pairs(items: list[str]) -> list[float]:
            body = {"queries": query, "documents": items, **self._truncation(family, truncate)}
            data = (await self._post_model("/score", body))["data"]
            return [row["score"] for row in sorted(data, key=lambda row: row["index"])]

        return [float(s) for s in await self._batched(docs, pairs)]

    async def _batched(self, items: list[Any], call: Callable[[list[Any]], Awaitable[list[Any]]]) -> list[Any]:
        """Run ``call`` over batches concurrently (spread over replicas) and concatenate in input order."""
        batches = [items[i : i + self._batch_size] for i in range(0, len(items), self._batch_size)]
        try:
            results = await asyncio.gather(*(call(b) for b in batches))
        except (KeyError, IndexError, TypeError) as exc:  # valid JSON, but not the answer of a pooling server
            raise RemoteError(f"The server's answer lacks the expected fields ({type(exc).__name__}: {exc}).") from exc
        out = [row for result in results for row in result]
        if len(out) != len(items):
            raise RemoteError(f"The server returned {len(out)} results for {len(items)} inputs.")
        return out

    @property
    def _name(self) -> str:
        """The name a server started with this model serves it under: a hub id without its ``@revision``."""
        return self.model if Path(self.model).is_dir() else split_reference(self.model)[0]

    async def _post_model(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` for this model, with the timeout of the call in progress."""
        return await self._replicas.post(path, {"model": await self._model_id(), **body}, _call_timeout.get())

    async def _model_id(self) -> str:
        """The name the server serves the model under (it may differ from the path this client was given)."""
        if self._served_model is None:
            answered, listing = await self._replicas.get_first("/v1/models")
            if answered:
                try:
                    models = listing["data"] if listing is not None else []
                except (KeyError, TypeError):
                    models = []
                self._served_model = models[0]["id"] if len(models) == 1 else self._name
        return self._served_model or self._name
