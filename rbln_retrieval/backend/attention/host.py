"""The host kernels' attention, outside the compiled graph: vLLM's CPU kernel over a whole step where it takes the
layers, else torch's fused CPU attention, one call per prompt.

On AVX-512 CPUs, a step whose layers vLLM's CPU attention kernel takes (``kernel_fits``) goes through that kernel
(``KernelPlan``): one call per layer over every prompt, its keys and values first copied into a per-step scratch
cache. Its scheduler metadata is built with KV splitting off, so each query's sum runs over its own prompt's keys
in one fixed order: results stay batch-invariant. Elsewhere (AVX2 CPUs, a head size it lacks) each prompt attends
through its own call of torch's fused attention (``HostPlan``), which is batch-invariant too: a text's vector never
depends on the other prompts of its step.

May import: the standard library, numpy, torch, ``rbln_retrieval.cpu_features``, ``vllm_compat`` (vLLM's CPU
attention ops).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rbln_retrieval import cpu_features
from rbln_retrieval.backend import vllm_compat


@dataclass
class KernelPlan:
    """One step for vLLM's CPU attention kernel: each prompt's keys and values go to its own blocks of ``cache``
    (``[blocks, kv_heads, block_size, 2 * head_size]``, shared by every layer of the step, each overwriting it)."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    scheduler_metadata: torch.Tensor
    cache: torch.Tensor
    tokens: int
    causal: bool
    isa: str


@dataclass
class HostPlan:
    """One step's host attention through torch: each prompt's (start, end) token range, contiguous from 0."""

    bounds: list[tuple[int, int]]


@dataclass(frozen=True)
class KernelShape:
    """What vLLM's CPU kernel needs to know of a layer group: heads, head size, dtype, the group's shared window
    (-1: none or not shared), the kernel's ISA and block size."""

    heads: int
    kv_heads: int
    head_size: int
    dtype: torch.dtype
    window: int
    isa: str
    block_size: int


def kernel_fits(head_size: int, dtype: torch.dtype) -> bool:
    """Whether the host uses vLLM's CPU kernel for such a layer: head sizes that are multiples of 16, on AVX-512
    CPUs, whose build converts to bfloat16 exactly and outruns torch's per-prompt calls (bench/results/hostspeed.md).
    AVX2 CPUs keep torch's calls: their build truncates to bfloat16, and its kernel is no faster there in float32."""
    return cpu_features.avx512() and head_size % 16 == 0 and dtype in (torch.float32, torch.bfloat16)


class ScratchCache:
    """The kernel's key/value cache, kept from step to step: zeroed when it grows, then each step writes its
    prompts' slots. A block's slots past its prompt's end keep finite values of earlier steps, which the kernel
    masks out (their softmax weight is exactly 0), so results equal those of a fresh zeroed cache per step, without
    allocating and zeroing megabytes at every step."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def take(self, blocks: int, shape: KernelShape) -> torch.Tensor:
        if self.buffer is None or self.buffer.shape[0] < blocks:
            self.buffer = torch.zeros(blocks, shape.kv_heads, shape.block_size, 2 * shape.head_size, dtype=shape.dtype)
        return self.buffer[:blocks]


def kernel_plan(
    shape: KernelShape, query_start_loc: torch.Tensor, causal: bool, scratch: ScratchCache | None = None
) -> KernelPlan:
    """The step's kernel plan from vLLM's ``query_start_loc`` (prompts contiguous from token 0, no KV context).
    The index arithmetic runs in numpy: a handful of small arrays, not worth torch's parallel regions."""
    starts = query_start_loc.numpy().astype(np.int32)
    seq_lens = np.diff(starts)
    block_size = shape.block_size
    blocks = (seq_lens + block_size - 1) // block_size
    first_block = np.zeros_like(blocks)
    np.cumsum(blocks[:-1], out=first_block[1:])
    block_table = first_block[:, None] + np.arange(int(blocks.max()), dtype=np.int32)[None, :]
    tokens = int(starts[-1])
    # Token j of prompt r sits at slot j of its prompt's blocks, which follow one another.
    shift = np.repeat(first_block.astype(np.int64) * block_size - starts[:-1], seq_lens)
    slot_mapping = np.arange(tokens, dtype=np.int64) + shift
    starts_t, seq_lens_t = torch.from_numpy(starts), torch.from_numpy(seq_lens)
    metadata = vllm_compat.cpu_attention_ops().cpu_attn_get_scheduler_metadata(
        num_reqs=seq_lens.size,
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_size,
        seq_lens=seq_lens_t,
        dtype=shape.dtype,
        query_start_loc=starts_t,
        causal=causal,
        sliding_window_size=shape.window,
        isa=shape.isa,
        enable_kv_split=False,  # a split sums a query's keys in an order that depends on the rest of the step
    )
    total = int(blocks.sum())
    cache = (scratch or ScratchCache()).take(total, shape)
    return KernelPlan(
        starts_t,
        seq_lens_t,
        torch.from_numpy(block_table),
        torch.from_numpy(slot_mapping),
        metadata,
        cache,
        tokens,
        causal,
        shape.isa,
    )


def kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: KernelPlan,
    scale: float,
    output: torch.Tensor,
    window: int | None,
) -> None:
    """Every prompt of the step through vLLM's CPU kernel, written into ``output``'s first ``plan.tokens`` rows."""
    n = plan.tokens
    blocks, kv_heads, block_size, _ = plan.cache.shape
    key_cache, value_cache = plan.cache.view(blocks, kv_heads, 2 * block_size, -1).chunk(2, dim=2)
    ops = vllm_compat.cpu_attention_ops()
    ops.cpu_attn_reshape_and_cache(key[:n], value[:n], key_cache, value_cache, plan.slot_mapping, plan.isa)
    ops.cpu_attention_with_kv_cache(
        query=query[:n],
        key_cache=key_cache,
        value_cache=value_cache,
        output=output[:n],
        query_start_loc=plan.query_start_loc,
        seq_lens=plan.seq_lens,
        scale=scale,
        causal=plan.causal,
        alibi_slopes=None,
        sliding_window=-1 if window is None else window,
        block_table=plan.block_table,
        softcap=0,
        scheduler_metadata=plan.scheduler_metadata,
        s_aux=None,
    )


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    step: HostPlan | KernelPlan,
    causal: bool,
    scale: float,
    output: torch.Tensor,
    window: int | None = None,
) -> None:
    """Writes each prompt's attention into ``output``'s rows of its tokens; rows past the prompts are untouched."""
    if isinstance(step, KernelPlan):
        kernel_attention(query, key, value, step, scale, output, window)
        return
    per_prompt_attention(query, key, value, step.bounds, causal, scale, output, window)


def per_prompt_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bounds: list[tuple[int, int]],
    causal: bool,
    scale: float,
    output: torch.Tensor,
    window: int | None = None,
) -> None:
    """Each prompt's rows attend among themselves through torch's fused attention, one call per prompt, written
    into ``output``'s first rows (``bounds`` are contiguous from 0)."""
    if not bounds:
        return
    q, k, v = _heads_first(query, key, value)
    parts = [_one_prompt(q, k, v, start, end, causal, scale, window) for start, end in bounds]
    # One copy per layer rather than one per prompt (every copy is a parallel region, each a wait for all threads).
    # The CPU kernel returns [1, heads, tokens, head_size] views of [tokens, heads, head_size] buffers, so the
    # parts are contiguous and the concatenation lands in ``output`` as plain block copies.
    torch.cat(parts, dim=0, out=output[: bounds[-1][1]])


def _heads_first(*tensors: torch.Tensor) -> list[torch.Tensor]:
    # [1, heads, tokens, head_size] views: torch's CPU flash kernel takes 4-d inputs only (else its math path).
    return [t.transpose(0, 1).unsqueeze(0) for t in tensors]


def _one_prompt(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    start: int,
    end: int,
    causal: bool,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """One prompt's attention as ``[tokens, heads, head_size]``; a prompt no longer than the window needs no mask."""
    mask = window_mask(end - start, window, causal) if window is not None and end - start > window else None
    out = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, start:end],
        k[:, :, start:end],
        v[:, :, start:end],
        attn_mask=mask,
        is_causal=causal and mask is None,
        scale=scale,
        enable_gqa=k.shape[1] != q.shape[1],
    )
    return out[0].transpose(0, 1)


def window_mask(tokens: int, window: int, causal: bool) -> torch.Tensor:
    """Which keys (columns) each query (row) of one prompt may see in a window of ``window`` (vLLM's convention)."""
    positions = torch.arange(tokens)
    offset = positions[:, None] - positions[None, :]
    allowed = offset.abs() < window
    return allowed & (offset >= 0) if causal else allowed
