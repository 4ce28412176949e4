"""The token counts a step is padded to: one compiled graph each, so their number is what an NPU pays for in
compile time and device memory, and their spacing is what every step pays for in padding.

Powers of two from 16, with a midpoint (1.5x) between neighbours from 256 up, to the step budget: a step lands
at most a third above its tokens where steps are large and costly, while short steps (queries) stay cheap. At
most ``MAX_GRAPHS`` buckets: for very long budgets the smallest midpoints go first.
"""

from __future__ import annotations

SMALLEST_BUCKET = 16
MIDPOINTS_FROM = 256
MAX_GRAPHS = 16


def derive_buckets(max_length: int, max_num_batched_tokens: int) -> list[int]:
    """Token-count buckets covering 1..max_num_batched_tokens (which must hold one full prompt)."""
    if max_num_batched_tokens < max_length:
        raise ValueError(
            f"max_num_batched_tokens={max_num_batched_tokens} is below max_length={max_length}; "
            "a step must hold one whole prompt."
        )
    sizes, size = {max_num_batched_tokens}, SMALLEST_BUCKET
    while size < max_num_batched_tokens:
        sizes.add(size)
        if size >= MIDPOINTS_FROM and size * 3 // 2 < max_num_batched_tokens:
            sizes.add(size * 3 // 2)
        size *= 2
    buckets = sorted(sizes)
    while len(buckets) > MAX_GRAPHS:
        midpoints = [b for b in buckets[:-1] if b & (b - 1)]
        buckets.remove(midpoints[0] if midpoints else buckets[0])
    return buckets
