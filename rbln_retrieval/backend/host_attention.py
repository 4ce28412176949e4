"""The host kernels' attention: vLLM's CPU kernel over a whole step, else torch's fused attention per prompt, short
prompts optionally packed into rows and attended in one masked call.

A step of short queries holds up to a few hundred prompts. Attending to each through its own call of torch's
fused CPU attention makes hundreds of small calls per layer, each a parallel region that waits for every thread; on a
2-core CPU with 32-wide heads the calls cost more in dispatch and barriers than in arithmetic, and on a loaded
machine each wait can cost a scheduler time slice. So prompts up to ``ROW_WIDTH`` tokens are packed
first-fit-decreasing into ``rows x width`` slots (``rows.ffd_offsets``, as the static steps lay theirs out), and
every layer gathers its queries, keys and values into those rows, runs one fused attention call with a
block-diagonal mask and scatters the result back: four data movements and one kernel instead of one kernel per
prompt. Longer prompts fill the cores on their own and keep one unmasked call each. The layout and the mask are
built once per step (``plan``) and shared by every layer.

Masked keys get exactly zero weight, so each prompt's result is the per-prompt result up to the order of
floating-point sums (within the float32 parity bound). Padding slots attend to themselves only: finite, never
read back.

On AVX-512 CPUs, a step whose layers vLLM's CPU attention kernel takes (``kernel_fits``) goes through that
kernel instead (``KernelPlan``): one call per layer over every prompt, its keys and values first copied into a
per-step scratch cache. Its scheduler metadata is built with KV splitting off, so each query's sum runs over its
own prompt's keys in one fixed order: results stay batch-invariant.

May import: the standard library, numpy, torch, vLLM's custom ops, ``rbln_retrieval.backend.rows``,
``rbln_retrieval.cpu_features``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from vllm import _custom_ops as ops

from rbln_retrieval import cpu_features
from rbln_retrieval.backend import rows

# The width to ask for (``host_row_width``): prompts up to this many tokens share rows, a row at most this wide, so a
# mask is rows x width^2. Measured in the engine (bench/results/hostspeed.md): 1,024 queries of ~15 tokens ran 5x
# faster in rows; ingest passages of ~140 tokens ran no faster in 256-wide rows than alone (1.5x the scored pairs, a
# masked kernel). Off by default: a masked call sums in another order than a prompt's own call, so a short text's
# vector would depend on the other prompts of its step (by about 1e-7); one call per prompt keeps it batch-invariant.
ROW_WIDTH = 64


@dataclass
class RowBatch:
    """Short prompts laid out in ``shape`` rows: ``source[slot]`` is the token a slot gathers, ``tokens[i]`` the
    step's token whose result sits at ``slots[i]``; ``seq`` is ``[rows, width]``, the prompt per slot (padding
    slots distinct negative ids)."""

    shape: rows.Shape
    source: torch.Tensor
    tokens: torch.Tensor
    slots: torch.Tensor
    seq: torch.Tensor
    causal: bool
    leading: bool  # the packed prompts are the step's first ``len(tokens)`` tokens, in order
    _bias: dict[tuple[torch.dtype, int | None], torch.Tensor] = field(default_factory=dict)
    _rows: dict[tuple[int, torch.dtype, torch.Size], torch.Tensor] = field(default_factory=dict)

    def gather(self, which: int, t: torch.Tensor) -> torch.Tensor:
        """``t``'s tokens in slot order, into a buffer every layer of the step reuses: a fresh multi-megabyte
        tensor per layer costs about as much in first-touch page faults as the copy itself."""
        key = (which, t.dtype, t.shape[1:])
        if key not in self._rows:
            self._rows[key] = t.new_empty(self.source.numel(), *t.shape[1:])
        return torch.index_select(t, 0, self.source, out=self._rows[key])

    def bias(self, dtype: torch.dtype, window: int | None) -> torch.Tensor:
        """The additive ``[rows, 1, width, width]`` mask, built once per step and window (layers may differ in
        their windows) rather than once per layer."""
        if (dtype, window) not in self._bias:
            allowed = self.seq[:, :, None] == self.seq[:, None, :]
            positions = torch.arange(self.shape[1])
            offset = positions[:, None] - positions[None, :]  # prompts are contiguous in a row: in-prompt distances
            if self.causal:
                allowed &= offset >= 0
            if window is not None:
                allowed &= offset.abs() < window
            bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, -torch.inf)
            self._bias[dtype, window] = bias.unsqueeze(1)
        return self._bias[dtype, window]


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
    """One step's host attention through torch: the short prompts' rows (None when fewer than two) and the other
    prompts' (start, end) token ranges."""

    batch: RowBatch | None
    alone: list[tuple[int, int]]


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
    CPUs. Their build converts to bfloat16 exactly and beat torch's per-prompt calls (1.32x on a MiniLM bf16 ingest);
    on AVX2 CPUs, where the build truncates to bfloat16, vLLM 0.32's kernel measured slower than torch's calls in
    float32 (docs/benchmarks/history.md), so they keep those."""
    return cpu_features.avx512() and head_size % 16 == 0 and dtype in (torch.float32, torch.bfloat16)


def kernel_plan(shape: KernelShape, query_start_loc: torch.Tensor, causal: bool) -> KernelPlan:
    """The step's kernel plan from vLLM's ``query_start_loc`` (prompts contiguous from token 0, no KV context)."""
    starts = query_start_loc.to(torch.int32)
    seq_lens = starts[1:] - starts[:-1]
    block_size = shape.block_size
    blocks = (seq_lens + block_size - 1) // block_size
    first_block = torch.zeros_like(blocks)
    torch.cumsum(blocks[:-1], 0, out=first_block[1:])
    block_table = first_block[:, None] + torch.arange(int(blocks.max()), dtype=torch.int32)[None, :]
    tokens = int(starts[-1])
    # Token j of prompt r sits at slot j of its prompt's blocks, which follow one another.
    shift = torch.repeat_interleave(first_block.long() * block_size - starts[:-1].long(), seq_lens.long())
    slot_mapping = torch.arange(tokens, dtype=torch.int64) + shift
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=seq_lens.numel(),
        num_heads=shape.heads,
        num_kv_heads=shape.kv_heads,
        head_dim=shape.head_size,
        seq_lens=seq_lens,
        dtype=shape.dtype,
        query_start_loc=starts,
        causal=causal,
        sliding_window_size=shape.window,
        isa=shape.isa,
        enable_kv_split=False,  # a split sums a query's keys in an order that depends on the rest of the step
    )
    cache = torch.zeros(int(blocks.sum()), shape.kv_heads, block_size, 2 * shape.head_size, dtype=shape.dtype)
    return KernelPlan(starts, seq_lens, block_table, slot_mapping, metadata, cache, tokens, causal, shape.isa)


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


def plan(bounds: list[tuple[int, int]], bucket: int, causal: bool, row_width: int | None = None) -> HostPlan:
    """The step's layout from each prompt's (start, end) token range, in vLLM's contiguous order; prompts up to
    ``row_width`` tokens (default ``ROW_WIDTH``; 0: none) share rows."""
    limit = ROW_WIDTH if row_width is None else row_width
    short = [i for i, (start, end) in enumerate(bounds) if end - start <= limit]
    if len(short) < 2:
        return HostPlan(None, bounds)
    alone = [(start, end) for start, end in bounds if end - start > limit]
    lengths = [bounds[i][1] - bounds[i][0] for i in short]
    width = rows.align(max(lengths))
    count = -(-sum(lengths) // width)
    while (offsets := rows.ffd_offsets(lengths, (count, width))) is None:
        count += 1
    real = bounds[-1][1]
    # Padding slots gather a padding token when the bucket has one (any token would do: nothing reads them back).
    source = np.full(count * width, real if real < bucket else 0, dtype=np.int64)
    # Request index per slot; padding slots get distinct negative ids, so each attends to itself only.
    seq = -1 - np.arange(count * width, dtype=np.int64)
    tokens = np.concatenate([np.arange(*bounds[i]) for i in short])
    slots = np.concatenate([np.arange(at, at + n) for at, n in zip(offsets, lengths)])
    source[slots] = tokens
    seq[slots] = np.repeat(np.arange(len(short)), lengths)
    leading = bool((tokens == np.arange(tokens.size)).all())
    batch = RowBatch(
        (count, width),
        torch.from_numpy(source),
        torch.from_numpy(tokens),
        torch.from_numpy(slots),
        torch.from_numpy(seq.reshape(count, width)),
        causal,
        leading,
    )
    return HostPlan(batch, alone)


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
    if step.batch is None:
        per_prompt_attention(query, key, value, step.alone, causal, scale, output, window)
        return
    row_attention(query, key, value, step.batch, scale, output, window)
    q, k, v = _heads_first(query, key, value)
    for start, end in step.alone:
        output[start:end] = _one_prompt(q, k, v, start, end, causal, scale, window)


def row_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    batch: RowBatch,
    scale: float,
    output: torch.Tensor,
    window: int | None = None,
) -> None:
    """The batch's prompts: gathered into rows, one masked fused-attention call, scattered back into ``output``."""
    count, width = batch.shape
    heads, head_size = query.shape[1:]
    # [rows, heads, width, head_size] views of gathered [rows * width, heads, head_size] buffers.
    q, k, v = (
        batch.gather(i, t).view(count, width, t.shape[1], head_size).transpose(1, 2)
        for i, t in enumerate((query, key, value))
    )
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=batch.bias(q.dtype, window), scale=scale, enable_gqa=k.shape[1] != heads
    )
    flat = out.transpose(1, 2).reshape(count * width, heads, head_size)
    if batch.leading:
        torch.index_select(flat, 0, batch.slots, out=output[: batch.slots.numel()])
    else:
        output.index_copy_(0, batch.tokens, flat.index_select(0, batch.slots))


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
