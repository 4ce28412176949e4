"""RemoteEngine: the PoolingEngine API against `rbln-retrieval serve` replicas (vLLM's OpenAI-compatible server).

Prompts and templates are applied here exactly as in local mode and raw text is sent, so remote results equal
local ones. Inputs are cut into batches that are spread over the healthy replicas; a replica that fails is taken
out for a cool-down and its batch is retried elsewhere with backoff, so every input gets exactly one result, in
input order, or the call raises.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
import numpy as np

from rbln_retrieval.engine import EngineOptions, _chunks, _ranked
from rbln_retrieval.errors import ModelNotSupportedError, RBLNRetrievalError
from rbln_retrieval.families import (
    QWEN3_RERANKER_PAIR,
    QWEN3_RERANKER_PREFIX,
    QWEN3_RERANKER_SUFFIX,
    ModelFamily,
    detect_family,
)
from rbln_retrieval.inputs import check_dimensions, check_query
from rbln_retrieval.loop import EngineLoop
from rbln_retrieval.model_source import resolve_model, split_reference

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 60.0


class RemoteError(RBLNRetrievalError, ConnectionError):
    """No replica answered usably within the retries (connection refused, timeout, 5xx, malformed JSON)."""


class RemoteAuthError(RBLNRetrievalError, PermissionError):
    """The server rejected the API key (HTTP 401/403); retrying cannot help."""


@dataclass
class _Replica:
    url: str
    down_until: float = 0.0
    failures: int = 0

    def failed(self) -> None:
        self.failures += 1
        self.down_until = time.monotonic() + min(60.0, 2.0 ** self.failures)

    def succeeded(self) -> None:
        self.failures, self.down_until = 0, 0.0


class RemoteEngine:
    """``embed``/``score``/``rerank`` (sync and async) served by one or more remote replicas."""

    _shared: ClassVar[dict[tuple[Any, ...], RemoteEngine]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

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
        **options: Any,
    ):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls or not all(isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"base_url must be an http(s) URL or a non-empty list of them, got {base_url!r}.")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1.")
        self.model = str(model)
        self.options = EngineOptions(**options)
        self.family: ModelFamily = self._family(
            revision=revision, cache_folder=cache_folder, token=token, local_files_only=local_files_only
        )
        self._replicas = [_Replica(u.rstrip("/")) for u in urls]
        self._api_key = api_key if api_key is not None else os.environ.get("RBLN_API_KEY")
        self._timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        self._batch_size = batch_size
        self._max_retries = max_retries
        self._loop = EngineLoop("rbln-retrieval-remote")
        self._client: httpx.AsyncClient | None = None
        self._served_model: str | None = None

    def _family(self, **source_args: Any) -> ModelFamily:
        """The family from the model's configs: a local directory, or a hub id's config files (no weights)."""
        try:
            source = resolve_model(self.model, weights=False, **source_args)
        except ModelNotSupportedError as exc:
            # The client may not have the model files: prompts then come only from explicit instructions.
            logger.info("%s Prompts come only from explicit instructions.", exc)
        else:
            return detect_family(source.path, max_length=self.options.max_length, family=self.options.family)
        return ModelFamily(
            name=self.options.family or "bi-encoder",
            architecture="remote",
            hidden_size=0,
            max_length=self.options.max_length or 0,
        )

    @classmethod
    def shared(cls, model: str | os.PathLike[str], *, base_url: str | list[str], **kwargs: Any) -> RemoteEngine:
        urls = (base_url,) if isinstance(base_url, str) else tuple(base_url)
        # The hub token only fetches config files; like EngineOptions, the key leaves it out.
        key = (str(model), urls, repr(sorted((k, v) for k, v in kwargs.items() if k != "token")))
        with cls._shared_lock:
            if key not in cls._shared:
                cls._shared[key] = cls(model, base_url=base_url, **kwargs)
            return cls._shared[key]

    def __repr__(self) -> str:  # never shows the API key
        return f"RemoteEngine(model={self.model!r}, replicas={[r.url for r in self._replicas]})"

    def close(self) -> None:
        with self._shared_lock:
            for key, engine in list(self._shared.items()):
                if engine is self:
                    del self._shared[key]
        if self._client is not None and not self._loop.loop.is_closed():
            self._loop.run(self._client.aclose())
        self._loop.close()

    def __enter__(self) -> RemoteEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def dimension(self) -> int:
        if not self.family.hidden_size:
            self.family = ModelFamily(**{**self.family.__dict__, "hidden_size": self.embed([""]).shape[1]})
        return self.family.hidden_size

    # -- public API (same signatures as PoolingEngine) ----------------------------------------------------------
    def embed(self, texts: Iterable[str], *, kind: Literal["document", "query"] = "document",
              instruction: str | None = None, dimensions: int | None = None, normalize: bool = True,
              show_progress: bool = False) -> np.ndarray:
        return self._loop.run(self._embed(texts, kind, instruction, dimensions, normalize))

    async def aembed(self, texts: Iterable[str], *, kind: Literal["document", "query"] = "document",
                     instruction: str | None = None, dimensions: int | None = None, normalize: bool = True,
                     show_progress: bool = False) -> np.ndarray:
        return await self._loop.arun(self._embed(texts, kind, instruction, dimensions, normalize))

    def score(self, query: str, documents: Iterable[str], *, instruction: str | None = None) -> list[float]:
        return self._loop.run(self._score(query, documents, instruction))

    async def ascore(self, query: str, documents: Iterable[str], *, instruction: str | None = None) -> list[float]:
        return await self._loop.arun(self._score(query, documents, instruction))

    def rerank(self, query: str, documents: Iterable[str], *, top_n: int | None = None,
               instruction: str | None = None) -> list[tuple[int, float]]:
        return _ranked(self.score(query, documents, instruction=instruction), top_n)

    async def arerank(self, query: str, documents: Iterable[str], *, top_n: int | None = None,
                      instruction: str | None = None) -> list[tuple[int, float]]:
        return _ranked(await self.ascore(query, documents, instruction=instruction), top_n)

    # -- implementation (on the client's loop) ------------------------------------------------------------------
    def _truncation(self) -> dict[str, Any]:
        if self.options.truncate == "error" or not self.family.max_length:
            return {}
        if self.options.truncate == "start":
            # vLLM then slices the token list, special tokens included: close to, not equal to, local "start".
            return {"truncate_prompt_tokens": self.family.max_length, "truncation_side": "left"}
        # Without a side vLLM truncates inside the tokenizer, which keeps special tokens as local mode does.
        return {"truncate_prompt_tokens": self.family.max_length}

    async def _embed(self, texts, kind, instruction, dimensions, normalize, what="texts") -> np.ndarray:
        if self.family.is_cross_encoder:
            raise ValueError(f"{self.model} is a reranker ({self.family.name}); it scores pairs and cannot embed.")
        if kind not in ("document", "query"):
            raise ValueError(f"kind={kind!r} is not 'document' or 'query'.")
        if self.family.hidden_size:
            check_dimensions(dimensions, hidden_size=self.family.hidden_size, matryoshka=self.family.matryoshka,
                             model=self.model)
        prefix = self.family.query_prefix(instruction) if kind == "query" else self.family.document_prefix(instruction)
        payload: dict[str, Any] = {"use_activation": normalize, **self._truncation()}
        if dimensions is not None:
            payload["dimensions"] = dimensions
        prompts = [prefix + t for _, chunk in _chunks(texts, what) for t in chunk]
        if not prompts:
            return np.zeros((0, dimensions or self.family.hidden_size), dtype=np.float32)

        async def batch(items: list[str]) -> list[list[float]]:
            data = (await self._post("/v1/embeddings", {**payload, "input": items}))["data"]
            return [row["embedding"] for row in sorted(data, key=lambda row: row["index"])]

        return np.asarray(await self._batched(prompts, batch), dtype=np.float32)

    async def _score(self, query: str, documents: Iterable[str], instruction: str | None) -> list[float]:
        query = check_query(query)
        docs = [d for _, chunk in _chunks(documents, "documents") for d in chunk]
        if not docs:
            return []
        if not self.family.is_cross_encoder:
            doc_vectors = await self._embed(docs, "document", None, None, True, what="documents")
            return [float(s) for s in doc_vectors @ (await self._embed([query], "query", instruction, None, True))[0]]
        if self.family.name == "qwen3-reranker":
            task = instruction if instruction is not None else self.family.default_instruction
            prompts = [
                QWEN3_RERANKER_PREFIX + QWEN3_RERANKER_PAIR.format(instruction=task, query=query, document=d)
                + QWEN3_RERANKER_SUFFIX
                for d in docs
            ]

            async def batch(items: list[str]) -> list[float]:
                body = {"input": items, "add_special_tokens": False, **self._truncation()}
                data = (await self._post("/classify", body))["data"]
                return [row["probs"][0] for row in sorted(data, key=lambda row: row["index"])]

            return [float(s) for s in await self._batched(prompts, batch)]
        if instruction is not None:
            raise ValueError(f"{self.model} is a cross-encoder and takes no instruction; leave instruction unset.")

        async def pairs(items: list[str]) -> list[float]:
            data = (await self._post("/score", {"queries": query, "documents": items, **self._truncation()}))["data"]
            return [row["score"] for row in sorted(data, key=lambda row: row["index"])]

        return [float(s) for s in await self._batched(docs, pairs)]

    async def _batched(self, items: list[Any], call) -> list[Any]:
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

    def _pick(self) -> _Replica:
        now = time.monotonic()
        healthy = [r for r in self._replicas if r.down_until <= now]
        if healthy:
            return random.choice(healthy)
        return min(self._replicas, key=lambda r: r.down_until)  # all down: try the one that went down first

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx.AsyncClient(headers=headers, timeout=self._timeout)
        body = {"model": await self._model_id(), **body}
        failure = "no attempt made"
        for attempt in range(self._max_retries + 1):
            replica = self._pick()
            try:
                response = await self._client.post(replica.url + path, json=body)
            except httpx.TimeoutException:
                failure = f"{replica.url} timed out after {self._timeout:g} s"
            except httpx.TransportError as exc:
                failure = f"could not reach {replica.url} ({type(exc).__name__}: {exc})"
            else:
                if response.status_code in (401, 403):
                    raise RemoteAuthError(
                        f"{replica.url} rejected the request with HTTP {response.status_code}: "
                        "set api_key (or RBLN_API_KEY) to the server's key."
                    )
                if 400 <= response.status_code < 500:
                    message = _error_message(response)
                    if self._api_key:  # a proxy may echo the request headers back
                        message = message.replace(self._api_key, "***")
                    raise ValueError(f"{replica.url}{path} rejected the request: {message}")
                if response.status_code >= 500:
                    failure = f"{replica.url} answered HTTP {response.status_code}"
                else:
                    try:
                        payload = response.json()
                        replica.succeeded()
                        return payload
                    except ValueError:
                        failure = f"{replica.url} answered with malformed JSON"
            replica.failed()
            if attempt < self._max_retries:
                await asyncio.sleep(min(4.0, 0.25 * 2**attempt) * (0.5 + random.random()))
        raise RemoteError(f"{path} failed after {self._max_retries + 1} attempts; last: {failure}.")

    async def _model_id(self) -> str:
        """The name the server serves the model under (it may differ from the path this client was given)."""
        if self._served_model is None:
            for replica in self._replicas:
                try:
                    response = await self._client.get(replica.url + "/v1/models")
                    models = response.json()["data"] if response.status_code == 200 else []
                except (httpx.HTTPError, ValueError, KeyError):
                    continue
                self._served_model = models[0]["id"] if len(models) == 1 else self._name
                break
        return self._served_model or self._name

    @property
    def _name(self) -> str:
        """The name a server started with this model serves it under: a hub id without its ``@revision``."""
        return self.model if Path(self.model).is_dir() else split_reference(self.model)[0]


def _error_message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", response.json())
        return str(error.get("message", error) if isinstance(error, dict) else error)
    except ValueError:
        return response.text[:200]
