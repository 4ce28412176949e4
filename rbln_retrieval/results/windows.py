"""A long text's window rows to its result: the token-weighted mean of its windows' vectors (normalized again when
the call normalizes), every window's vector with its span (``Chunk(output="all")``), or a document's best window
score. Pure numpy on rows the engine pooled; the windows themselves are cut in rbln_retrieval.text.chunks and
pooled through rbln_retrieval.engines.windows.

Imports: results (outputs); numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rbln_retrieval.results.outputs import normalized


@dataclass(frozen=True)
class ChunkedEmbedding:
    """One text's windows under ``Chunk(output="all")``: ``vectors`` float32 (windows, d) in text order, and each
    window's character ``spans`` (start, end) in the text and its count of the text's ``tokens`` (the weights of
    ``output="mean"``)."""

    vectors: np.ndarray
    spans: list[tuple[int, int]]
    tokens: list[int]


def combine(
    vectors: Sequence[np.ndarray],
    spans: list[tuple[int, int]],
    tokens: list[int],
    *,
    output: Literal["mean", "all"],
    normalize: bool,
) -> np.ndarray | ChunkedEmbedding:
    """One text's result from its windows' vectors (in text order)."""
    if output == "all":
        return ChunkedEmbedding(np.stack(vectors).astype(np.float32, copy=False), spans, tokens)
    if len(vectors) == 1:  # a text that fits: its vector as computed, not normalized again
        return vectors[0]
    weights = np.asarray(tokens, dtype=np.float64)
    mean = (np.stack(vectors).astype(np.float64) * weights[:, None]).sum(0) / weights.sum()
    return normalized(mean) if normalize else mean.astype(np.float32)


def best(current: float, window_score: float) -> float:
    """A document's score so far after one more of its windows: its best window's."""
    return max(current, float(window_score))
