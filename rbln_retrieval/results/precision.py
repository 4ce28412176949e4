"""What each compute dtype promises against a float32 computation of the same model: the bounds `make demo` judges
by, the benchmarks report against and the tests assert (tests/tolerances.py builds on them). Imports nothing.

A unit vector ``a`` computed in a dtype and its float32 computation ``b`` have ``cos(a, b) >= MIN_COSINE[dtype]``,
so ``|a - b| <= sqrt(2 (1 - MIN_COSINE))`` (their Euclidean distance, which also bounds every component). A cosine
score of two such vectors then differs from float32's by at most the sum of their distances (Cauchy-Schwarz):
``score_bound``. Two paths in the same dtype (another batch composition, another process) are each within that
of float32, so within twice of each other.
"""

from __future__ import annotations

import math

# bfloat16 matmuls (8 significant bits) with float32 pooling and normalization: bfloat16 itself, in
# sentence-transformers' own forward as in this engine, reaches about 0.9999 on the demo corpus' worst passage (a
# truncated 256-token table; bench/results/hostspeed.md), so the promise leaves 2x that in 1 - cosine.
# float32: two correct float32 implementations (other kernels, other summation order) of a 6-24 layer encoder, as
# tests/engine/test_minilm.py asserts against sentence-transformers.
MIN_COSINE = {"float32": 0.99999, "bfloat16": 0.9998}


def unit_distance(dtype: str) -> float:
    """Largest Euclidean distance of a unit vector computed in ``dtype`` from its float32 computation."""
    return math.sqrt(2 * (1 - MIN_COSINE[dtype]))


def score_bound(dtype: str) -> float:
    """Largest difference of a cosine score (query vector . document vector) from its float32 computation."""
    return 2 * unit_distance(dtype)
