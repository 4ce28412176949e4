"""Tolerances derived from the arithmetic, so that a test passes on every CPU class (AVX512-BF16 and AVX2-only
machines run different oneDNN, ATen and vLLM kernel builds, which round and sum in different orders).

A float result of ``roundings`` correctly rounded operations differs from the exact value by at most
``roundings * eps / 2`` relative; two correct implementations differ by at most the sum of their bounds. A
reduction over ``n`` terms adds at most ``n * eps`` relative to the sum of magnitudes (the classic recursive-sum
bound; blocked and vectorized kernels do better, never worse).
"""

from __future__ import annotations

import torch

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
