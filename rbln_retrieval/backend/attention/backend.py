"""One attention backend for the bundled runner's padded, context-free pooling steps.

A step holds whole prompts packed back to back and padded up to a bucket. The metadata builder keeps vLLM's
exact ``build(common_prefix_len, common_attn_metadata, fast_build=False)`` signature and derives everything from
``CommonAttentionMetadata``: the bucket is ``num_actual_tokens``, the real tokens end at ``query_start_loc[-1]``.
That keeps it correct when vLLM wraps it for encoder-only layers (the wrapper forwards exactly those three
arguments and sets ``causal=False``).

Sliding windows follow vLLM's convention (its CPU kernel, FlashAttention): a window of ``W`` keeps the keys at
most ``W - 1`` positions from the query, on both sides for bidirectional layers and behind it for causal ones.
Models translate their own configs into it (an alternating local/global encoder passes
``local_attention // 2 + 1``, a sliding-window decoder its ``sliding_window``), which reproduces transformers' masks.

Two implementations (``BundledConfig.kernels``), both parity-tested against the stock runner:
- ``static``: masked attention per row of the step's ``rows x width`` shape (additive float mask, explicit
  matmuls and softmax) whose shapes depend on the shape only, traced into the compiled graph (the platform turns
  vLLM's opaque attention op off for it): what a static-shape NPU graph needs. Padding slots attend among
  themselves so they stay finite.
- ``host``: behind vLLM's opaque attention op, vLLM's own CPU attention kernel over the whole step (one call per
  layer; its keys and values copied into a per-step scratch cache), as the stock runner uses it, on AVX-512 CPUs;
  elsewhere (AVX2 CPUs, a head size it lacks) torch's fused CPU attention per prompt (``attention.host``). Padding
  rows are zeroed.

No step reads KV context (the bundled runner turns chunked prefill and prefix caching off), so nothing is
written to the KV cache: pooling requests finish in the step that computes them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from vllm.config import VllmConfig, get_layers_from_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.v1.attention.backend import AttentionImpl, AttentionMetadataBuilder, AttentionType, CommonAttentionMetadata
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
from vllm.v1.kv_cache_interface import AttentionSpec, EncoderOnlyAttentionSpec

from rbln_retrieval.backend import vllm_compat
from rbln_retrieval.backend.attention import host as host_attention
from rbln_retrieval.backend.attention.masked import packed_attention
from rbln_retrieval.backend.config import BundledConfig


@dataclass
class PackedAttentionMetadata:
    num_actual_tokens: int  # the bucket: every row the layer must write
    num_real_tokens: int
    causal: bool
    # static path: request index per slot, padding -1 (it attends only among itself); the runner replaces the
    # builder's contiguous [tokens] with its layout's [rows, width]
    seq_ids: torch.Tensor
    # host path: the step's plan for host_attention (None on the static path)
    host: host_attention.HostPlan | host_attention.KernelPlan | None = None


class PackedAttentionMetadataBuilder(AttentionMetadataBuilder[PackedAttentionMetadata]):
    def __init__(
        self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.encoder_only = isinstance(kv_cache_spec, EncoderOnlyAttentionSpec)
        bundled = BundledConfig.from_vllm_config(vllm_config)
        self.host = bundled.kernels == "host"
        self.kernel = self._kernel_shape(vllm_config, layer_names, kv_cache_spec) if self.host else None
        self.scratch = host_attention.ScratchCache()

    @staticmethod
    def _kernel_shape(
        vllm_config: VllmConfig, layer_names: list[str], spec: AttentionSpec
    ) -> host_attention.KernelShape | None:
        """The group's shape for vLLM's CPU kernel, None when a layer needs torch's (host_attention.kernel_fits)."""
        impls = [layer.impl for layer in get_layers_from_vllm_config(vllm_config, Attention, layer_names).values()]
        if not impls:
            return None
        dtype = vllm_config.model_config.dtype
        if not all(host_attention.kernel_fits(impl.head_size, dtype) for impl in impls):
            return None
        windows = {impl.sliding_window for impl in impls}
        shared = windows.pop() if len(windows) == 1 else None
        first = impls[0]
        return host_attention.KernelShape(
            heads=first.num_heads,
            kv_heads=first.num_kv_heads,
            head_size=spec.head_size,
            dtype=dtype,
            window=-1 if shared is None else shared,
            isa=vllm_compat.cpu_attention_isa(dtype, spec.block_size, spec.head_size),
            block_size=spec.block_size,
        )

    def describe(self) -> str:
        """How this group's layers attend, for the runner's stats and `rbln-retrieval doctor --graphs`: on an AMX
        CPU, bfloat16 layers should read ``amx`` (vLLM picks it when the KV block size is a multiple of 32)."""
        if not self.host:
            return "masked attention in the graph"
        if self.kernel is not None:
            return f"vLLM's CPU kernel, {self.kernel.isa} ISA, KV blocks of {self.kernel.block_size}"
        return "torch's fused attention per prompt"

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: CommonAttentionMetadata,
        fast_build: bool = False,
    ) -> PackedAttentionMetadata:
        cm = common_attn_metadata
        bucket = cm.num_actual_tokens
        query_start = cm.query_start_loc_cpu[: cm.num_reqs + 1]
        real = int(query_start[-1])
        query_lens = query_start[1:] - query_start[:-1]
        if not torch.equal(query_lens.to(cm.seq_lens.dtype), cm.seq_lens.cpu()):
            raise RuntimeError(
                "The bundled runner got a step whose requests carry KV context (chunked prefill or prefix "
                "caching is on); start the engine through rbln_retrieval so both are off."
            )
        causal = bool(cm.causal) and not self.encoder_only
        # int32 sequence indices, as vllm-rbln casts them for the NPU.
        seq_ids = torch.full((bucket,), -1, dtype=torch.int32)
        seq_ids[:real] = torch.from_numpy(np.repeat(np.arange(cm.num_reqs, dtype=np.int32), query_lens.numpy()))
        host: host_attention.HostPlan | host_attention.KernelPlan | None = None
        if self.kernel is not None:
            host = host_attention.kernel_plan(self.kernel, query_start, causal, self.scratch)
        elif self.host:
            host = host_attention.HostPlan(list(itertools.pairwise(query_start.tolist())))
        return PackedAttentionMetadata(bucket, real, causal, seq_ids, host)


class PackedAttentionImpl(AttentionImpl[PackedAttentionMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        unsupported = {
            "ALiBi": alibi_slopes is not None,
            "logit soft-capping": bool(logits_soft_cap),
            "attention sinks": sinks is not None,
            f"{attn_type} attention": attn_type not in (AttentionType.DECODER, AttentionType.ENCODER_ONLY),
        }
        if found := [name for name, present in unsupported.items() if present]:
            raise NotImplementedError(f"The bundled pooling runner does not support {', '.join(found)}.")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.sliding_window = sliding_window

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: PackedAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("The bundled pooling runner does not fuse output quantization.")
        if attn_metadata is None:  # vLLM's profiling pass
            return output
        md = attn_metadata
        if md.host is not None:
            host_attention.attend(query, key, value, md.host, md.causal, self.scale, output, self.sliding_window)
            output[md.num_real_tokens : md.num_actual_tokens].zero_()
            return output
        output[: md.num_actual_tokens] = packed_attention(
            query[: md.num_actual_tokens],
            key[: md.num_actual_tokens],
            value[: md.num_actual_tokens],
            md.seq_ids,
            md.causal,
            self.scale,
            self.sliding_window,
        )
        return output


class PackedAttentionBackend(CPUAttentionBackend):
    """vLLM's CPU backend (its KV-cache layout and head sizes) with the packed-bucket builder and impl."""

    forward_includes_kv_cache_update: ClassVar[bool] = True

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[PackedAttentionImpl]:
        return PackedAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[PackedAttentionMetadataBuilder]:
        return PackedAttentionMetadataBuilder
