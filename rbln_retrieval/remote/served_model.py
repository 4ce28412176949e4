"""One model as `rbln-retrieval serve` replicas serve it, seen from RemoteEngine: its family and the name the
replicas serve it under.

The server describes its model (family, prompts, dimensions, max length) on ``DESCRIBE_PATH``; the client reads it
once, so a client that has only the model's name applies prompts and templates exactly as local mode does. A plain
vLLM server gives no description: the family then comes from the model's config files where the client can read
them, else from the family's defaults. The description also advertises the server's limits, under which calls are
cut into batches here.

Imports: engines (options, protocol), errors, models (families, family_prompts, source), remote (replicas), text
(tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.errors import ModelNotFoundError, ModelNotSupportedError
from rbln_retrieval.models.families import ModelFamily, detect_family
from rbln_retrieval.models.family_prompts import default_document_prompt, default_instruction, default_query_prompt
from rbln_retrieval.models.source import resolve_model, split_reference
from rbln_retrieval.remote.replicas import Replicas
from rbln_retrieval.text.tokens import PromptTokenizer

logger = logging.getLogger(__name__)

# Bytes a server counts as one token when it bounds queued tokens (rbln_retrieval.server.limits.TOKEN_BYTES), and
# what a request's body holds beside its inputs (model name, options): both kept clear of the server's bounds.
TOKEN_BYTES = 4
BODY_RESERVE = 4096


class RemoteModel:
    """The family (an explicit ``family`` option must agree with the server's and stands in where the server gives
    none) and the served name, each asked of the replicas once and then kept."""

    def __init__(self, model: str, options: EngineOptions, replicas: Replicas, source_args: dict[str, Any]) -> None:
        self.model = model
        self.options = options
        self._replicas = replicas
        # Where a hub id's config files come from, for a server that does not describe its model.
        self._source_args = source_args
        self.family: ModelFamily | None = None  # known once a replica has answered
        self._served_name: str | None = None
        self.quantizes = False  # the server answers QUANTIZED_EMBED_PATH (an `rbln-retrieval serve` server does)
        self._tokenizer: PromptTokenizer | None = None
        # The server's advertised bounds (max_payload_bytes, max_queued_tokens, ...; empty: none known).
        self.limits: dict[str, int | None] = {}

    async def described(self) -> ModelFamily:
        """The family, asked of the replicas until one answers."""
        if self.family is None:
            answered, served = await self._server_family()
            if not answered:  # no replica up: the call fails in post with the usual error; ask again next time
                return self._checked_family(None, warn=False)
            self.family = self._checked_family(served)
        return self.family

    async def tokenizer(self, family: ModelFamily) -> PromptTokenizer:
        """The model's tokenizer, read from the model's files on this machine (its directory, or the Hugging Face
        cache, fetched there when online): truncate="chunk" cuts windows on the client, so local and remote engines
        read the same windows."""
        if self._tokenizer is None:
            try:
                source = await asyncio.to_thread(resolve_model, self.model, weights=False, **self._source_args)
                self._tokenizer = await asyncio.to_thread(
                    PromptTokenizer, source.path, family, trust_remote_code=self.options.trust_remote_code
                )
            except (ModelNotFoundError, ModelNotSupportedError, OSError) as exc:
                raise ValueError(
                    f"truncate='chunk' cuts windows with {self.model}'s tokenizer on this machine, and it cannot be "
                    f"read here ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})."
                ) from exc
        return self._tokenizer

    async def _server_family(self) -> tuple[bool, ModelFamily | None]:
        """(whether a replica answered, the family it describes or None for a server without the route)."""
        answered, description = await self._replicas.get_first(DESCRIBE_PATH)
        if description is None:
            return answered, None
        self.quantizes = description.get("quantized_embeddings") == QUANTIZED_EMBED_PATH
        if isinstance(description.get("limits"), dict):
            self.limits = description["limits"]
            self._replicas.limit_in_flight(self.limits.get("max_concurrent_requests"))
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

    def batches(self, items: list[str], batch_size: int, reserve: int = 0) -> list[list[str]]:
        """``items`` cut into consecutive batches of at most ``batch_size``, each request's body (with ``reserve``
        bytes of other fields) under the server's max_payload_bytes and max_queued_tokens, JSON escapes counted;
        an input over them alone is refused before any request."""
        bounds = [self.limits.get("max_payload_bytes"), (self.limits.get("max_queued_tokens") or 0) * TOKEN_BYTES]
        budget = min(b for b in bounds if b) - BODY_RESERVE - reserve if any(bounds) else None
        batches: list[list[str]] = []
        size = 0
        for index, item in enumerate(items):
            item_size = len(json.dumps(item)) + 2  # with ", "
            if budget is not None and item_size > budget:
                raise ValueError(
                    f"Input {index} is {item_size} bytes as JSON, over the {budget} bytes a request to this server may "
                    "hold (its max_payload_bytes and max_queued_tokens); shorten it or raise the server's limits."
                )
            if not batches or len(batches[-1]) >= batch_size or (budget is not None and size + item_size > budget):
                batches.append([])
                size = 0
            batches[-1].append(item)
            size += item_size
        return batches

    @property
    def _name(self) -> str:
        """The name a server started with this model serves it under: a hub id without its ``@revision``."""
        return self.model if Path(self.model).is_dir() else split_reference(self.model)[0]

    async def post(self, path: str, body: dict[str, Any], timeout: float | None) -> dict[str, Any]:
        """POST ``body`` for this model to a replica."""
        return await self._replicas.post(path, {"model": await self._served_id(), **body}, timeout)

    async def _served_id(self) -> str:
        """The name the server serves the model under (it may differ from the path this client was given)."""
        if self._served_name is None:
            answered, listing = await self._replicas.get_first("/v1/models")
            if answered:
                try:
                    models = listing["data"] if listing is not None else []
                except (KeyError, TypeError):
                    models = []
                self._served_name = models[0]["id"] if len(models) == 1 else self._name
        return self._served_name or self._name
