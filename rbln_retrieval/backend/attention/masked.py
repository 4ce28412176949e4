"""The static kernels' attention: block-diagonal masked attention per row of a ``rows x width`` step, in torch ops
whose shapes depend on the step's shape only, traced into the compiled graph (what a static-shape NPU graph needs).

May import: torch.
"""

from __future__ import annotations

import torch

# Query slots per masked-attention tile: bounds the static path's score tensor at heads x TILE x row width.
TILE = 512


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    seq_ids: torch.Tensor,
    causal: bool,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Block-diagonal attention per row of a static step, written as an NPU compiler lowers it (and as
    optimum-rbln's BERT and transformers' eager attention write it): matmuls, an additive float mask, a float32
    softmax. ``seq_ids`` is ``[rows, width]`` (the step's shape; 1-d: one row): each query meets its own row's
    keys only, so a step computes rows x width^2 scores rather than (rows x width)^2. Every shape depends on the
    step's shape only; prompts are contiguous within a row, so slot distances are the distances a window limits.
    Score tensors stay within heads x TILE x width: rows in groups, queries of wide rows in tiles."""
    seq = seq_ids if seq_ids.dim() == 2 else seq_ids[None]
    rows, width = seq.shape
    tokens, heads, _ = query.shape
    if key.shape[1] != heads:  # grouped-query attention: expand, not repeat_interleave (an int64 gather)
        key, value = (_expand_heads(t, heads) for t in (key, value))
    q, k, v = (t.reshape(rows, width, heads, t.shape[-1]).transpose(1, 2) for t in (query, key, value))
    positions = torch.arange(width, dtype=torch.int32)
    blocked = torch.finfo(torch.float32).min
    group, span = max(1, TILE // width), min(width, TILE)
    outputs = []
    for first in range(0, rows, group):
        part = slice(first, min(first + group, rows))
        keys_t = k[part].transpose(2, 3)
        tiles = []
        for start in range(0, width, span):
            queries = slice(start, min(start + span, width))
            allowed = seq[part, queries, None] == seq[part, None, :]
            offset = positions[queries, None] - positions[None, :]
            if causal:
                allowed = allowed & (offset >= 0)
            if window is not None:
                allowed = allowed & (offset.abs() < window)
            bias = torch.where(allowed, 0.0, blocked).unsqueeze(1)
            scores = torch.matmul(q[part, :, queries], keys_t).float() * scale + bias
            probs = torch.softmax(scores, dim=-1).to(v.dtype)
            tiles.append(torch.matmul(probs, v[part]))
        outputs.append(tiles[0] if len(tiles) == 1 else torch.cat(tiles, dim=2))
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=0)
    return out.transpose(1, 2).reshape(tokens, heads, out.shape[-1])


def _expand_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    tokens, kv_heads, dim = t.shape
    return t[:, :, None, :].expand(tokens, kv_heads, heads // kv_heads, dim).reshape(tokens, heads, dim)
