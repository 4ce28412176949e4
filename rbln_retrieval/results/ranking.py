"""Scores -> a ranking, the one rule every reranker of this package applies.

Imports nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def rank(scores: Sequence[float], top_n: int | None = None) -> list[tuple[int, float]]:
    """(index, score) pairs, best first, ties in input order, a NaN score after every number (a NaN compares false
    with everything, so a plain sort would leave it, and the scores around it, anywhere); ``top_n`` None keeps all,
    0 or less returns []."""
    if top_n is not None and top_n <= 0:
        return []
    order = sorted(
        range(len(scores)), key=lambda i: (True, 0.0, i) if math.isnan(scores[i]) else (False, -scores[i], i)
    )
    return [(i, float(scores[i])) for i in order[:top_n]]
