"""Step packing: fill each step's token budget, because the runner pads every step up to a bucket.

vLLM's scheduler admits waiting prompts first come, first served and, with chunked prefill off, stops at the
first prompt that does not fit. A full step then ends about half a prompt short of the budget, and the runner
pads that gap. Before each step this scheduler moves later prompts that fit the gap up behind the ones FCFS would
admit (first fit over a bounded lookahead). Every prompt FCFS would put into a step is still in it; only prompts
that would otherwise wait for a later step move forward, so the oldest prompt never waits longer.

When what waits cannot fill the largest bucket (the tail of a call, or a small call), the step's budget becomes
the bucket that computes the fewest tokens per useful token, a step's fixed cost counted in: a 1,100-token tail
runs as a 1,024-token step and a small one rather than one step padded to 1,536. The oldest prompt is always in
the step.

Static (NPU) steps are ``rows x width`` shapes with attention per row (``rows``): there each step takes the shape
and the prompts (first fit over the lookahead, the oldest always in) with the most useful FLOPs per computed FLOP,
attention counted, so long prompts run in wide single rows and short ones share narrow rows.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Sequence
from typing import Any

from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from rbln_retrieval.backend import rows
from rbln_retrieval.backend.config import BundledConfig

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
    taken, _ = _first_fit([_tokens(r) for r in window], budget, max_requests)
    _move_front(waiting, window, taken)


def pack_rows(waiting: deque[Request], shapes: Sequence[rows.Shape], costs: rows.Costs, max_requests: int) -> int:
    """Reorder the front of ``waiting`` so that FCFS admission takes the prompts ``rows.choose`` picks for a
    static step; returns their tokens (the step's budget, so admission stops right after them)."""
    window = [waiting.popleft() for _ in range(min(LOOKAHEAD, len(waiting)))]
    sizes = [_tokens(r) for r in window]
    _, taken = rows.choose(sizes, shapes, costs, max_requests)
    _move_front(waiting, window, taken)
    return sum(sizes[i] for i in taken)


def _move_front(waiting: deque[Request], window: list[Request], taken: list[int]) -> None:
    chosen = set(taken)
    admitted = [window[i] for i in taken]
    deferred = [r for i, r in enumerate(window) if i not in chosen]
    waiting.extendleft(reversed(admitted + deferred))


def _tokens(request: Request) -> int:
    return request.num_tokens - request.num_computed_tokens


class PackingScheduler(Scheduler):
    """vLLM's scheduler with each step's budget chosen among the buckets and the waiting queue's front packed
    into it (FCFS policy only: a priority queue's order is the caller's to set)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bundled = BundledConfig.from_vllm_config(self.vllm_config)
        self.buckets = [b for b in bundled.buckets if b <= self.max_num_scheduled_tokens]
        self.step_cost = bundled.step_cost_tokens
        self.shapes = bundled.shapes if bundled.rows else None
        if self.shapes is not None:
            ratio = rows.attention_ratio(self.vllm_config.model_config.hf_text_config)
            self.costs = rows.Costs(ratio, self.step_cost)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        # Pooling requests finish in the step that computes them; with requests still running (another
        # workload) their share of the budget is unknown here, and FCFS is left as it is. So it is while vLLM
        # holds requests it skipped in an earlier step (its second queue), which it merges by arrival.
        largest = self.max_num_scheduled_tokens
        if self.policy != SchedulingPolicy.FCFS or self.running or self.skipped_waiting or len(self.waiting) < 2:
            if self.shapes is None:
                return super().schedule(*args, **kwargs)
            # Whatever FCFS admits within the widest single row, that row holds: a static step always has a shape.
            self.max_num_scheduled_tokens = max(w for r, w in self.shapes if r == 1)
            try:
                return super().schedule(*args, **kwargs)
            finally:
                self.max_num_scheduled_tokens = largest
        if self.shapes is not None:
            budget = pack_rows(self.waiting, self.shapes, self.costs, self.max_num_running_reqs)
        else:
            window = [_tokens(r) for r in itertools.islice(self.waiting, LOOKAHEAD)]
            budget = choose_budget(window, self.buckets, self.max_num_running_reqs, self.step_cost)
            pack_front(self.waiting, budget, self.max_num_running_reqs)
        self.max_num_scheduled_tokens = budget
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = largest
