"""Long texts through an engine, opt-in (``truncate="chunk"`` or ``Chunk(...)``): each chunk of texts is planned into
windows (rbln_retrieval.text.chunks, in a worker thread), the windows are pooled by the engine's own call
WINDOW_BATCH at a time, and each text's rows are combined as its last window arrives
(rbln_retrieval.results.windows).

Memory stays bounded: texts are taken CHUNK_SIZE at a time, their windows held as spans, not strings, and a text's
rows only until it is complete.

Imports: results (windows), text (chunks, inputs); numpy.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np

from rbln_retrieval.results.windows import ChunkedEmbedding, best, combine
from rbln_retrieval.text.chunks import Plan, Windows, check_dense_only
from rbln_retrieval.text.inputs import CHUNK_SIZE, Chunk, chunks

# Windows embedded or scored per engine call: the engine's own batching unit.
WINDOW_BATCH = CHUNK_SIZE


async def _stream(
    windows: Windows,
    texts: Iterable[str],
    *,
    what: str,
    run: Callable[[list[str]], Awaitable[Any]],
    plan: Callable[[int, list[Plan]], None],
    take: Callable[[int, Any], None],
) -> None:
    """Plan each chunk of ``texts`` (``plan(index of its first text, plans)``, in a worker thread), then run ``run``
    over its windows WINDOW_BATCH at a time, handing each row in order to ``take(index of its text, row)``."""
    for first, chunk in chunks(texts, what):
        plans = await asyncio.to_thread(windows.spans, chunk, what, first)
        plan(first, plans)
        items = ((first + i, text[a:b]) for i, (text, (spans, _)) in enumerate(zip(chunk, plans)) for a, b in spans)
        while batch := list(itertools.islice(items, WINDOW_BATCH)):
            rows = await run([piece for _, piece in batch])
            for (index, _), row in zip(batch, rows):
                take(index, row)


async def embed_windowed(
    windows: Windows,
    texts: Iterable[str],
    chunk: Chunk,
    *,
    normalize: bool,
    embed: Callable[[list[str]], Awaitable[np.ndarray]],
    output: Any = "dense",
    what: str = "texts",
) -> np.ndarray | list[ChunkedEmbedding]:
    """One vector per text (``chunk.output == "mean"``) or one ChunkedEmbedding per text (``"all"``), in input
    order; ``embed`` embeds a list of window texts as the call embeds texts (an empty list: the empty result)."""
    check_dense_only(output, windows.family)
    plans: dict[int, Plan] = {}
    rows: list[np.ndarray] = []
    results: list[Any] = []

    def plan(first: int, chunk_plans: list[Plan]) -> None:
        plans.update((first + i, p) for i, p in enumerate(chunk_plans))

    def take(index: int, row: np.ndarray) -> None:
        # Windows arrive in text order: a text's rows are complete when its last window arrives.
        rows.append(row)
        spans, tokens = plans[index]
        if len(rows) == len(spans):
            del plans[index]
            results.append(combine(rows, spans, tokens, output=chunk.output, normalize=normalize))
            rows.clear()

    await _stream(windows, texts, what=what, run=embed, plan=plan, take=take)
    if chunk.output == "all":
        return results
    if not results:
        return await embed([])
    return np.stack(results).astype(np.float32, copy=False)


async def score_windowed(
    windows: Windows,
    documents: Iterable[str],
    chunk: Chunk,
    *,
    score: Callable[[list[str]], Awaitable[list[float]]],
    output: str = "dense",
) -> list[float]:
    """Each document's best window's score, in input order; ``score`` scores a list of window texts."""
    check_dense_only(output, windows.family)
    if chunk.output != "mean":
        raise ValueError("Chunk(output='all') applies to embed; a document's score is its best window's.")
    scores: list[float] = []

    def plan(first: int, chunk_plans: list[Plan]) -> None:
        scores.extend([-np.inf] * len(chunk_plans))

    def take(index: int, row: float) -> None:
        scores[index] = best(scores[index], row)

    await _stream(windows, documents, what="documents", run=score, plan=plan, take=take)
    return scores
