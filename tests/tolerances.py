"""Tolerances derived from the arithmetic, so that a test passes on every CPU class (AVX512-BF16 and AVX2-only
machines run different oneDNN, ATen and vLLM kernel builds, which round and sum in different orders).

A float result of ``roundings`` correctly rounded operations differs from the exact value by at most
``roundings * eps / 2`` relative; two correct implementations differ by at most the sum of their bounds. A
reduction over ``n`` terms adds at most ``n * eps`` relative to the sum of magnitudes (the classic recursive-sum
bound; blocked and vectorized kernels do better, never worse).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from rbln_retrieval.results.precision import MIN_COSINE, score_bound, unit_distance

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 1.19e-7

# Unit vectors from the same model through float32 kernels of different builds (oneDNN ISA, attention kernel,
# batch composition). Rounding errors of a blocked reduction over n terms grow like sqrt(n) * eps: with n <= 1536
# (MiniLM's FFN) that is <= 4.7e-6 relative per layer, and each LayerNorm re-scales rather than compounds it;
# components of a unit vector are <= 1, so 1e-5 is twice the per-layer bound.
FP32_ACROSS_KERNELS = 1e-5
# The same kernels and the same batch shapes (only the request order or the call path differs): rounding can only
# differ where the GEMM's blocking differs by row count, a handful of eps on each unit-vector component.
FP32_SAME_KERNELS = 1e-6
# Tiny random-weight models against plain transformers (another attention formulation and GEMM order, and no
# LayerNorm-bounded magnitudes: random weights give hidden states of magnitude ~10), unit vectors or probabilities.
FP32_VS_REFERENCE = 1e-4


def rounding_bound(reference: torch.Tensor, roundings: int, reduced_terms: int = 0) -> torch.Tensor:
    """Elementwise bound on |a - b| for two implementations whose results together carry ``roundings``
    roundings in ``reference``'s dtype (eps/2 relative each) and a float32 reduction over ``reduced_terms`` terms
    that scales the result (n * eps relative), plus the dtype's smallest normal for zeros."""
    info = torch.finfo(reference.dtype)
    relative = roundings * info.eps / 2 + reduced_terms * FLOAT32_EPS
    return relative * reference.double().abs() + info.tiny


# bfloat16 matmuls (pooling and normalization in float32) against float32: the README's promise, a cosine
# (rbln_retrieval.results.precision). Two bfloat16 paths of one model (another batch composition, so other GEMM blocking
# and other roundings; another process) are each within that angle of float32, so within twice it of each other.
BF16_MIN_COSINE = MIN_COSINE["bfloat16"]
# The bfloat16 engines' options in tests: steps of at most 1024 tokens keep warmup short where bf16 is emulated.
BF16_OPTIONS = {
    "device": "cpu",
    "dtype": "bfloat16",
    "engine_kwargs": {"additional_config": {"rbln_retrieval": {"max_num_batched_tokens": 1024}}},
}
BF16_BETWEEN_PATHS_MIN_COSINE = math.cos(2 * math.acos(BF16_MIN_COSINE))  # 0.9992
BF16_BETWEEN_PATHS = 2 * unit_distance("bfloat16")  # on each component of a unit vector: 0.04
BF16_SCORE = score_bound("bfloat16")  # a cosine score against float32's: 0.04


def min_row_cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def assert_bf16_close_to_float32(got: np.ndarray, want_fp32: np.ndarray) -> None:
    """``got`` (bfloat16) within the promised cosine of the float32 computation ``want_fp32``, row by row."""
    assert np.shape(got) == np.shape(want_fp32)
    cosine = min_row_cosine(got, want_fp32)
    assert cosine >= BF16_MIN_COSINE, f"min cosine {cosine:.6f} against float32 < {BF16_MIN_COSINE}"


def assert_bf16_paths_agree(got: np.ndarray, want: np.ndarray) -> None:
    """Two bfloat16 computations of the same unit vectors (other path, batching or process)."""
    assert np.shape(got) == np.shape(want)
    cosine = min_row_cosine(got, want)
    assert cosine >= BF16_BETWEEN_PATHS_MIN_COSINE, f"min cosine {cosine:.6f} < {BF16_BETWEEN_PATHS_MIN_COSINE:.6f}"
    np.testing.assert_allclose(got, want, atol=BF16_BETWEEN_PATHS, rtol=0)


def assert_matches_local(got: np.ndarray, local_fp32: np.ndarray, dtype: str, atol: float) -> None:
    """Vectors computed in ``dtype`` (what "auto" resolved to) against the local float32 engine's: equal within
    ``atol`` in float32, within the promised cosine in bfloat16."""
    if dtype == "float32":
        np.testing.assert_allclose(got, local_fp32, atol=atol, rtol=0)
    else:
        assert dtype == "bfloat16", dtype
        assert_bf16_close_to_float32(got, local_fp32)


def assert_sparse_close(ours: list[dict[int, float]], theirs: list[dict[int, float]], tolerance: float) -> None:
    """Sparse {token_id: weight} vectors equal within ``tolerance``: a weight within rounding of zero may fall on
    either side of relu (present on one side only); every other token must be on both sides."""
    assert len(ours) == len(theirs)
    for index, (a, b) in enumerate(zip(ours, theirs)):
        solid = {t for t, w in b.items() if w > tolerance}
        assert solid <= set(a), f"texts[{index}] lacks tokens {solid - set(a)}"
        assert set(a) <= set(b) | {t for t, w in a.items() if w <= tolerance}, f"texts[{index}] has extra tokens"
        assert max((abs(a.get(t, 0.0) - b.get(t, 0.0)) for t in set(a) | set(b)), default=0.0) <= tolerance
