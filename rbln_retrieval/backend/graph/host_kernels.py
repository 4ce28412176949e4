"""vLLM's compiled CPU kernels for RMSNorm, offered to vLLM's IR ops for the bundled runner's host kernels.

vLLM's stock CPU runner fuses RMSNorm through Inductor; the bundled runner does not compile on the host, and
vLLM registers its C RMSNorm kernels for GPUs only, so eager RMSNorm would run as six torch ops with float32
round trips, many times slower than the C kernel (bench/backend.py measures a decoder's step both ways).
The platform imports this module (``import_ir_kernels``) and puts these implementations first only for engines
with host kernels (``BundledConfig.kernels``); the NPU's graphs keep the torch implementation.
"""

from __future__ import annotations

import torch
from torch import Tensor
from vllm import ir
from vllm.platforms import current_platform

from rbln_retrieval import cpu_features
from rbln_retrieval.backend import vllm_compat

current_platform.import_kernels()  # loads vLLM's C ops
C_OPS = vllm_compat.c_ops()
PROVIDER = "rbln_host"
SUPPORTED = hasattr(C_OPS, "rms_norm") and hasattr(C_OPS, "fused_add_rms_norm")


# vLLM's AVX2 kernel build converts float32 to bfloat16 by truncation, not round-to-nearest: its bf16 RMSNorm is
# about twice as far from the exact value as the torch implementation, and truncated residual sums drift downward
# layer after layer. bf16 is emulated (and slow) on those CPUs anyway, so bf16 keeps the torch implementation there.
EXACT_DTYPES = (torch.float32, torch.bfloat16) if cpu_features.avx512() else (torch.float32,)


def _weighted_same_dtype(x: Tensor, weight: Tensor | None, variance_size: int | None) -> bool:
    # The C kernels take a weight of the input's dtype and normalise over the whole last dimension.
    return weight is not None and weight.dtype == x.dtype and x.dtype in EXACT_DTYPES and variance_size is None


@ir.ops.rms_norm.register_impl(
    PROVIDER,
    supported=SUPPORTED,
    supports_args=lambda x, weight, epsilon, variance_size=None: _weighted_same_dtype(x, weight, variance_size),
)
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    # The kernel assumes packed rows; per-head q/k norms pass strided views of the qkv projection.
    x = x.contiguous()
    output = torch.empty_like(x)
    C_OPS.rms_norm(output, x, weight, epsilon)
    return output


@ir.ops.fused_add_rms_norm.register_impl(
    PROVIDER,
    supported=SUPPORTED,
    supports_args=lambda x, x_residual, weight, epsilon, variance_size=None: (
        _weighted_same_dtype(x, weight, variance_size) and x.is_contiguous() and x_residual.is_contiguous()
    ),
    inplace=True,
)
def fused_add_rms_norm(
    x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None
) -> tuple[Tensor, Tensor]:
    C_OPS.fused_add_rms_norm(x, x_residual, weight, epsilon)
    return x, x_residual
