"""Step packing: fill each step's token budget, because the runner pads every step up to a bucket.

vLLM's scheduler admits waiting prompts first come, first served and, with chunked prefill off, stops at the
first prompt that does not fit. A full step then ends about half a prompt short of the budget, and the runner
pads that gap. Before each step this scheduler moves later prompts that fit the gap up behind the ones FCFS would
admit (first fit over a bounded lookahead). Every prompt FCFS would put into a step is still in it; only prompts
that would otherwise wait for a later step move forward, so the oldest prompt never waits longer.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

# Prompts examined per step: enough to find a gap-filler in a mixed-length queue, cheap at any queue length.
LOOKAHEAD = 256


def pack_front(waiting: deque[Request], budget: int, max_requests: int, lookahead: int = LOOKAHEAD) -> None:
    """Reorder the front of ``waiting`` so that FCFS admission up to the first misfit takes a first-fit packing
    of the next ``lookahead`` prompts into ``budget`` tokens and ``max_requests`` requests."""
    window = [waiting.popleft() for _ in range(min(lookahead, len(waiting)))]
    admitted: list[Request] = []
    deferred: list[Request] = []
    used = 0
    for request in window:
        tokens = request.num_tokens - request.num_computed_tokens
        if len(admitted) < max_requests and used + tokens <= budget:
            admitted.append(request)
            used += tokens
        else:
            deferred.append(request)
    waiting.extendleft(reversed(admitted + deferred))


class PackingScheduler(Scheduler):
    """vLLM's scheduler with the waiting queue's front packed before each step (FCFS policy only: a priority
    queue's order is the caller's to set)."""

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        # Pooling requests finish in the step that computes them; with requests still running (another
        # workload) their share of the budget is unknown here, and FCFS is left as it is.
        if self.policy == SchedulingPolicy.FCFS and not self.running and len(self.waiting) > 1:
            pack_front(self.waiting, self.max_num_scheduled_tokens, self.max_num_running_reqs)
        return super().schedule(*args, **kwargs)
