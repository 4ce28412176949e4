"""The packing scheduler: vLLM's scheduler with each step's budget chosen among the buckets (or, for static steps,
among the row shapes) and the waiting queue's front packed into it by ``step.packing``.

The scheduler runs in vLLM's engine-core process; the runner pads what it admits to the chosen bucket.
"""

from __future__ import annotations

import itertools
from typing import Any

from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler

from rbln_retrieval.backend.config import BundledConfig
from rbln_retrieval.backend.step import rows
from rbln_retrieval.backend.step.packing import LOOKAHEAD, choose_budget, pack_front, pack_rows, tokens_of


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
            ratio = rows.attention_ratio(self.vllm_config.model_config.hf_text_config, bundled.gated_mlp)
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
            window = [tokens_of(r) for r in itertools.islice(self.waiting, LOOKAHEAD)]
            budget = choose_budget(window, self.buckets, self.max_num_running_reqs, self.step_cost)
            pack_front(self.waiting, budget, self.max_num_running_reqs)
        self.max_num_scheduled_tokens = budget
        try:
            return super().schedule(*args, **kwargs)
        finally:
            self.max_num_scheduled_tokens = largest
