"""Row shapes of the static (NPU) steps: a step is ``rows x width`` tokens, prompts are packed into rows, and
attention runs per row, so a query is scored against its row's ``width`` keys and not against the whole step.

Whole-step masked attention grows with the step's tokens squared while the useful work grows with each prompt's
length squared: at 4,096-token steps of ~140-token prompts, 62% of an encoder's FLOPs went to masked-out scores.
Rows bound the keys per query by the row width; prompts longer than a row run in single wide rows.

The shapes (``derive_shapes``): single rows of 64, 128, ... up to ``row_width`` for small steps, ``R x row_width``
for R = 2, 4, ... up to the step budget, and single rows of 2x, 4x ... ``row_width`` up to the model's length
(rounded up to 64). Every token dimension is a multiple of 64, as the RBLN compiler requires. The scheduler
(``packing``) picks a step's prompts for the shape that computes the fewest FLOPs per useful FLOP; the runner lays
the admitted prompts out (``plan``): the cheapest shape into which first-fit-decreasing packs them, which depends
on their lengths only (in the rare sets it cannot pack, first fit in the step's order, as the scheduler packed).

May import: the standard library, numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ALIGN = 64  # the RBLN compiler's token granularity: every token dimension of a graph is a multiple of it
DEFAULT_ROW_WIDTH = 256
# Multi-row shapes stop here unless the caller sets a larger step budget: long-context models would otherwise
# get a step budget of their full length (32k tokens for a long-context decoder) and 128-row graphs.
DEFAULT_ROW_STEP = 4096
MAX_SHAPES = 16

Shape = tuple[int, int]  # (rows, width)


def align(tokens: int) -> int:
    return -(-tokens // ALIGN) * ALIGN


def derive_shapes(max_length: int, max_tokens: int, row_width: int = DEFAULT_ROW_WIDTH) -> list[Shape]:
    """The static step shapes for prompts of at most ``max_length`` tokens and steps of at most ``max_tokens``."""
    if row_width % ALIGN or row_width <= 0:
        raise ValueError(f"row_width={row_width} must be a positive multiple of {ALIGN}.")
    longest = align(max_length)
    width = min(row_width, longest)
    shapes: set[Shape] = set()
    single = ALIGN
    while single < width:
        shapes.add((1, single))
        single *= 2
    rows = 1
    while rows * width <= max(max_tokens, width):
        shapes.add((rows, width))
        rows *= 2
    wide = width * 2
    while wide < longest:
        shapes.add((1, wide))
        wide *= 2
    shapes.add((1, longest))
    ordered = sorted(shapes, key=lambda s: (s[0] * s[1], s[1]))
    while len(ordered) > MAX_SHAPES:  # the smallest single rows go first: they only shorten tiny steps
        ordered.remove(next(s for s in ordered if s[0] == 1))
    return ordered


def check_shapes(shapes: Sequence[Sequence[int]], max_length: int) -> list[Shape]:
    """Explicit shapes from the caller, validated: one sentence naming the first bad one."""
    out: list[Shape] = []
    for shape in shapes:
        if len(shape) != 2 or any(int(x) <= 0 for x in shape):
            raise ValueError(f"shape {list(shape)} must be [rows, width] with both positive.")
        rows, width = int(shape[0]), int(shape[1])
        if width % ALIGN:
            raise ValueError(f"shape [{rows}, {width}]: the row width must be a multiple of {ALIGN} tokens.")
        out.append((rows, width))
    if not out or max(w for _, w in out) < max_length:
        raise ValueError(f"shapes {[list(s) for s in out]} must include a row of at least max_length={max_length}.")
    return sorted(set(out), key=lambda s: (s[0] * s[1], s[1]))


def attention_ratio(hf_config: Any, gated_mlp: bool = True) -> float:
    """Token-linear FLOPs per token over attention FLOPs per (query, key) pair, per layer: how many keys of
    padding cost as much as one token of weights. Read from the model's config; a gated MLP (``gated_mlp``, the
    family's preset says) has three matrices."""
    hidden = int(hf_config.hidden_size)
    heads = int(hf_config.num_attention_heads)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
    kv_heads = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    inner = int(getattr(hf_config, "intermediate_size", None) or 4 * hidden)
    q, kv = heads * head_dim, kv_heads * head_dim
    linear = 2 * (hidden * q + 2 * hidden * kv + q * hidden + (3 if gated_mlp else 2) * hidden * inner)
    return linear / (4 * q)


@dataclass(frozen=True)
class Costs:
    """A step's cost in token-equivalents: tokens, plus keys scored per query over ``ratio``, plus a fixed cost."""

    ratio: float
    step_tokens: int

    def shape(self, rows: int, width: int) -> float:
        return rows * width * (1 + width / self.ratio) + self.step_tokens

    def useful(self, lengths: Sequence[int]) -> float:
        return float(sum(n * (1 + n / self.ratio) for n in lengths))


def first_fit(sizes: Sequence[int], shape: Shape, max_requests: int, must: int = 0) -> list[int]:
    """Indices of ``sizes`` that first fit, in order, puts into ``shape``'s rows; ``must`` is tried first."""
    rows, width = shape
    fill = [0] * rows
    taken: list[int] = []
    for i in [must, *(j for j in range(len(sizes)) if j != must)]:
        if len(taken) >= max_requests:
            break
        for r in range(rows):
            if fill[r] + sizes[i] <= width:
                fill[r] += sizes[i]
                taken.append(i)
                break
    return sorted(taken)


def ffd_offsets(lengths: Sequence[int], shape: Shape) -> np.ndarray | None:
    """Each prompt's first slot when packed first-fit-decreasing into ``shape``'s rows (longest first, ties by
    index), which depends on the multiset of lengths only; else, in the rare sets where that fails and first fit in
    the given order does not, the latter; None if neither fits."""
    by_length = sorted(range(len(lengths)), key=lambda j: -lengths[j])
    for order in (by_length, range(len(lengths))):
        if (offsets := _first_fit_offsets(lengths, order, shape)) is not None:
            return offsets
    return None


def _first_fit_offsets(lengths: Sequence[int], order: Sequence[int], shape: Shape) -> np.ndarray | None:
    rows, width = shape
    fill = [0] * rows
    offsets = np.empty(len(lengths), dtype=np.int64)
    for i in order:
        for r in range(rows):
            if fill[r] + lengths[i] <= width:
                offsets[i] = r * width + fill[r]
                fill[r] += lengths[i]
                break
        else:
            return None
    return offsets


def choose(sizes: Sequence[int], shapes: Sequence[Shape], costs: Costs, max_requests: int) -> tuple[Shape, list[int]]:
    """The shape and the prompts (indices into ``sizes``, oldest first; ``sizes[0]`` always among them) a step
    should take: the pair with the most useful work per cost, among packings the runner's layout reproduces."""
    best: tuple[float, Shape, list[int]] | None = None
    for shape in shapes:
        if sizes[0] > shape[1]:
            continue
        taken = first_fit(sizes, shape, min(max_requests, shape[0] * shape[1]))
        while taken and ffd_offsets([sizes[i] for i in taken], shape) is None:
            taken.pop()  # first fit in order fitted, first-fit-decreasing did not: rare, drop the newest
        if 0 not in taken:
            continue
        rate = costs.useful([sizes[i] for i in taken]) / costs.shape(*shape)
        if best is None or rate > best[0]:
            best = (rate, shape, taken)
    if best is None:
        raise ValueError(f"No step shape holds a prompt of {sizes[0]} tokens (shapes {list(shapes)}).")
    return best[1], best[2]


@dataclass(frozen=True)
class Layout:
    """Where a step's tokens sit in its shape. ``source[slot]``: the index of the token (in vLLM's contiguous
    order) a slot takes, padding slots the first padding token; ``slot_of[token]``: the inverse for real tokens;
    ``seq_ids``: ``[rows, width]`` request index per slot, -1 on padding."""

    shape: Shape
    starts: np.ndarray  # each request's first slot
    lengths: np.ndarray
    source: np.ndarray
    slot_of: np.ndarray
    seq_ids: np.ndarray

    @property
    def tokens(self) -> int:
        return self.shape[0] * self.shape[1]


def plan(lengths: Sequence[int], shapes: Sequence[Shape], costs: Costs, force: Shape | None = None) -> Layout:
    """The cheapest shape the prompts of ``lengths`` (vLLM's order) pack into, and their layout in it."""
    candidates = [force] if force is not None else sorted(shapes, key=lambda s: costs.shape(*s))
    for shape in candidates:
        offsets = ffd_offsets(lengths, shape)
        if offsets is not None:
            return _layout(np.asarray(lengths, dtype=np.int64), offsets, shape)
    raise RuntimeError(f"A step of prompts of {list(lengths)} tokens fits none of the shapes {list(candidates)}.")


def _layout(lengths: np.ndarray, starts: np.ndarray, shape: Shape) -> Layout:
    tokens = shape[0] * shape[1]
    real = int(lengths.sum())
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    source = np.full(tokens, min(real, tokens - 1), dtype=np.int64)
    seq_ids = np.full(tokens, -1, dtype=np.int32)
    slot_of = np.empty(real, dtype=np.int64)
    for i, (start, length, at) in enumerate(zip(starts, lengths, first)):
        source[start : start + length] = np.arange(at, at + length)
        slot_of[at : at + length] = np.arange(start, start + length)
        seq_ids[start : start + length] = i
    return Layout(shape, starts, lengths, source, slot_of, seq_ids.reshape(shape))
