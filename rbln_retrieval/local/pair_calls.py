"""PoolingEngine's pair scoring (mixed into it): a cross-encoder's probability for each (query, document) pair or
for a text alone, and a template reranker's P(yes) inside its family's template; each chunk of documents is
tokenized off the engine loop (``off_loop``, which the embedding calls share) and run through the classifier head.

Imports: engines (loop), models (families), results (finite), text (inputs, prompts, tokens); vLLM inside the call
that builds its requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from rbln_retrieval.engines.loop import EngineLoop
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.results.finite import check_finite
from rbln_retrieval.text.inputs import Truncate, chunks
from rbln_retrieval.text.prompts import template_pairs
from rbln_retrieval.text.tokens import PromptTokenizer, Tokens

T = TypeVar("T")


class PairScoring:
    """The pair half of PoolingEngine: ``aclassify`` and the scoring router's pair and template steps."""

    family: ModelFamily
    model: str
    tokenizer: PromptTokenizer
    _loop: EngineLoop
    _encode: Callable[..., Awaitable[Any]]  # PoolingEngine's step through vLLM

    async def aclassify(self, texts: Iterable[str], *, truncate: Truncate = "end") -> list[float]:
        """A cross-encoder's first probability for each text alone: one sequence through its classifier head (TEI's
        /predict of one text), not a (query, document) pair."""
        if not self.family.is_cross_encoder:
            raise ValueError(f"{self.model} is an embedder; it has no classifier head to classify a text with.")

        async def tokenize(first: int, chunk: list[str]) -> list[Tokens]:
            return await off_loop(chunk, self.tokenizer.encode_texts, chunk, "", truncate, first_index=first)

        return await self._loop.arun(self._classify(texts, tokenize))

    async def _score_pairs(
        self, query: str, documents: Iterable[str], *, family: ModelFamily, instruction: str | None, truncate: Truncate
    ) -> list[float]:
        """A cross-encoder's P(relevant) of each (query, document) pair (it takes no instruction)."""

        async def tokenize(first: int, chunk: list[str]) -> list[Tokens]:
            return await off_loop(chunk, self.tokenizer.encode_pairs, query, chunk, truncate, first_index=first)

        return await self._classify(documents, tokenize)

    async def _score_template(
        self, query: str, documents: Iterable[str], *, family: ModelFamily, instruction: str | None, truncate: Truncate
    ) -> list[float]:
        """A template reranker's P(yes) for each document inside its family's template."""

        async def tokenize(first: int, chunk: list[str]) -> list[Tokens]:
            pairs = template_pairs(family, query, chunk, instruction)
            return await off_loop(chunk, self.tokenizer.encode_template, pairs, truncate, first_index=first)

        return await self._classify(documents, tokenize)

    async def _classify(
        self, documents: Iterable[str], tokenize: Callable[[int, list[str]], Awaitable[list[Tokens]]]
    ) -> list[float]:
        """The classifier's first probability for each document's prompt, ``tokenize(first index, chunk)``."""
        from vllm import PoolingParams

        params = PoolingParams(task="classify", use_activation=True)
        scores: list[float] = []
        for first, chunk in chunks(documents, what="documents"):
            tokens = await tokenize(first, chunk)
            scores.extend(float(row.reshape(-1)[0]) for row in await self._encode(tokens, params))
        check_finite(scores, "documents")
        return scores


# Tokenizing this few texts (at most a window of each, see text/tokens.py) costs less than a hop to a worker thread.
INLINE_TOKENIZE = 4


async def off_loop(chunk: list[str], fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a worker thread, so the engine loop keeps serving other callers while a large
    chunk is tokenized; a chunk of a few texts (a query) is tokenized in place."""
    if len(chunk) <= INLINE_TOKENIZE:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)
