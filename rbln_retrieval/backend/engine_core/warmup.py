"""Warm the buckets with real pooling steps once the KV cache exists, so nothing compiles while serving.

Traced engines (the rbln target, strict_shapes, a host compile backend) compile one graph per bucket, so every bucket
is warmed. The untraced host runs the same forward at any size with nothing to compile: one step of the smallest
bucket proves the model runs, and warming the rest would only spend the start on throwaway forwards.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from vllm.pooling_params import PoolingParams
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

logger = logging.getLogger(__name__)

NULL_BLOCK = 0


def _step(runner: Any, req_ids: list[str], new: list[NewRequestData], lengths: list[int]) -> SchedulerOutput:
    empty = SchedulerOutput.make_empty()
    empty.scheduled_new_reqs = new
    empty.num_scheduled_tokens = dict(zip(req_ids, lengths))
    empty.total_num_scheduled_tokens = sum(lengths)
    empty.num_common_prefix_blocks = [0] * len(runner.kv_cache_config.kv_cache_groups)
    return empty


def _lengths(shape: tuple[int, int], max_len: int, max_seqs: int) -> list[int]:
    """Prompt lengths filling ``shape``'s rows (``rows x width`` tokens; one row for host buckets), each within
    max_len, at most max_seqs of them.

    A shape larger than max_seqs prompts of max_len tokens (short prompts: a 16-token text tower) takes the max_seqs
    the scheduler may send: the shape is forced, so its graph is still the one compiled."""
    rows, width = shape
    per_row = [max_len] * (width // max_len) + ([width % max_len] if width % max_len else [])
    return (per_row * rows)[:max_seqs]


def warm_up(runner: Any) -> dict[str, float]:
    """One real ``execute_model`` per warmed bucket and in-graph pooling task; returns seconds per bucket."""
    model_config = runner.model_config
    max_len, max_seqs = model_config.max_model_len, runner.scheduler_config.max_num_seqs
    vocab = model_config.get_vocab_size()
    visible = runner.scheduler_kv_groups()  # only these get block ids, as the scheduler would give them
    tasks = sorted(runner.heads) or sorted(runner.get_supported_pooling_tasks())[:1]
    seconds: dict[str, float] = {}
    shapes = runner.bundled.shapes if runner.bundled.traced else runner.bundled.shapes[:1]
    static = bool(runner.bundled.rows)
    for shape in shapes:
        bucket = f"{shape[0]}x{shape[1]}" if static else str(shape[1])
        # The runner lays a step out in the cheapest shape that holds it: warmup names the one to compile.
        runner._force_shape = shape if static else None
        for task in tasks:
            started = time.perf_counter()
            lengths = _lengths(shape, max_len, max_seqs)
            ids = [f"warmup-{bucket}-{task}-{i}" for i in range(len(lengths))]
            new = []
            for req_id, length in zip(ids, lengths):
                params = PoolingParams(task=task)
                params.verify(model_config)
                blocks = tuple([NULL_BLOCK] * math.ceil(length / g.kv_cache_spec.block_size) for g in visible)
                new.append(
                    NewRequestData(
                        req_id=req_id,
                        prompt_token_ids=[1 + (i % (vocab - 1)) for i in range(length)],
                        mm_features=[],
                        sampling_params=None,
                        pooling_params=params,
                        block_ids=blocks,
                        num_computed_tokens=0,
                        lora_request=None,
                    )
                )
            output = runner.execute_model(_step(runner, ids, new, lengths))
            if output is None or output.pooler_output is None or any(o is None for o in output.pooler_output):
                raise RuntimeError(f"Warmup of bucket {bucket} ({task}) produced no pooled output.")
            finish = SchedulerOutput.make_empty()
            finish.finished_req_ids = set(ids)
            finish.scheduled_cached_reqs = CachedRequestData.make_empty()
            runner.execute_model(finish)
            seconds[f"{bucket}/{task}"] = time.perf_counter() - started
    runner._force_shape = None
    if runner.vision is not None:  # traced image-text models: every image-count bucket of the vision tower
        started = time.perf_counter()
        runner.vision.warm_up()
        seconds["vision"] = time.perf_counter() - started
    runner.finish_warmup()
    logger.info("Warmed %d buckets x %s in %.1f s", len(shapes), tasks, sum(seconds.values()))
    return seconds
