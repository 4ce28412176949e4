"""Scores -> a ranking, the one rule every reranker of this package applies.

Imports nothing.
"""

from __future__ import annotations

from collections.abc import Sequence


def rank(scores: Sequence[float], top_n: int | None = None) -> list[tuple[int, float]]:
    """(index, score) pairs, best first, ties in input order; ``top_n`` None keeps all, 0 or less returns []."""
    if top_n is not None and top_n <= 0:
        return []
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return [(i, float(scores[i])) for i in order[:top_n]]
