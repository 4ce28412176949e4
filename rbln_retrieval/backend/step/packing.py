"""Step packing: fill each step's token budget, because the runner pads every step up to a bucket.

vLLM's scheduler admits waiting prompts first come, first served and, with chunked prefill off, stops at the
first prompt that does not fit. A full step then ends about half a prompt short of the budget, and the runner
pads that gap. Before each step the packing scheduler (``engine_core.scheduler``) moves later prompts that fit
the gap up behind the ones FCFS would admit (first fit over a bounded lookahead, ``pack_front``). Every prompt
FCFS would put into a step is still in it; only prompts that would otherwise wait for a later step move forward,
so the oldest prompt never waits longer.

When what waits cannot fill the largest bucket (the tail of a call, or a small call), the step's budget becomes
the bucket that computes the fewest tokens per useful token, a step's fixed cost counted in: a 1,100-token tail
runs as a 1,024-token step and a small one rather than one step padded to 1,536. The oldest prompt is always in
the step.

Static (NPU) steps are ``rows x width`` shapes with attention per row (``rows``): there each step takes the shape
and the prompts (first fit over the lookahead, the oldest always in) with the most useful FLOPs per computed FLOP,
attention counted, so long prompts run in wide single rows and short ones share narrow rows.

May import: the standard library, ``step.rows``; vLLM's request type for typing only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rbln_retrieval.backend.step import rows

if TYPE_CHECKING:
    from vllm.v1.request import Request

# Prompts examined per step: enough to find a gap-filler in a mixed-length queue, cheap at any queue length.
LOOKAHEAD = 256
# A step that fills this much of the largest bucket runs as is: splitting it would only add steps.
FULL = 0.95


def _first_fit(sizes: Sequence[int], budget: int, max_requests: int) -> tuple[list[int], int]:
    """Indices of ``sizes`` a first-fit packing into ``budget`` tokens and ``max_requests`` requests takes."""
    taken, used = [], 0
    for i, tokens in enumerate(sizes):
        if len(taken) < max_requests and used + tokens <= budget:
            taken.append(i)
            used += tokens
    return taken, used


def choose_budget(sizes: Sequence[int], buckets: Sequence[int], max_requests: int, step_cost: int) -> int:
    """The step budget for prompts of ``sizes`` tokens (oldest first): the largest bucket when they fill it,
    else the bucket with the most useful tokens per computed token plus ``step_cost``."""
    largest = buckets[-1]
    if _first_fit(sizes, largest, max_requests)[1] >= FULL * largest:
        return largest
    best, best_rate = largest, -1.0
    for bucket in buckets:
        if bucket < sizes[0]:
            continue
        rate = _first_fit(sizes, bucket, max_requests)[1] / (bucket + step_cost)
        if rate > best_rate:
            best, best_rate = bucket, rate
    return best


def pack_front(waiting: deque[Request], budget: int, max_requests: int, lookahead: int = LOOKAHEAD) -> None:
    """Reorder the front of ``waiting`` so that FCFS admission up to the first misfit takes a first-fit packing
    of the next ``lookahead`` prompts into ``budget`` tokens and ``max_requests`` requests."""
    window = [waiting.popleft() for _ in range(min(lookahead, len(waiting)))]
    taken, _ = _first_fit([tokens_of(r) for r in window], budget, max_requests)
    _move_front(waiting, window, taken)


def pack_rows(waiting: deque[Request], shapes: Sequence[rows.Shape], costs: rows.Costs, max_requests: int) -> int:
    """Reorder the front of ``waiting`` so that FCFS admission takes the prompts ``rows.choose`` picks for a
    static step; returns their tokens (the step's budget, so admission stops right after them)."""
    window = [waiting.popleft() for _ in range(min(LOOKAHEAD, len(waiting)))]
    sizes = [tokens_of(r) for r in window]
    _, taken = rows.choose(sizes, shapes, costs, max_requests)
    _move_front(waiting, window, taken)
    return sum(sizes[i] for i in taken)


def _move_front(waiting: deque[Request], window: list[Request], taken: list[int]) -> None:
    chosen = set(taken)
    admitted = [window[i] for i in taken]
    deferred = [r for i, r in enumerate(window) if i not in chosen]
    waiting.extendleft(reversed(admitted + deferred))


def tokens_of(request: Request) -> int:
    return request.num_tokens - request.num_computed_tokens
