"""Upstream vllm-rbln's prefill, for comparison: one prompt per step, padded to max_length (the smallest size that
holds any prompt), reproduced with the bundled runner's ordinary settings: one bucket of max_length tokens (host
kernels) or one ``1 x max_length`` row shape (static kernels), and one request per step (vLLM's ``max_num_seqs``).

Used by bench/backend.py, bench/step_flops.py and bench/systems.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbln_retrieval import detect_family
from rbln_retrieval.backend.step.rows import align


def engine_kwargs(
    model: str | Path, *, max_length: int | None = None, static: bool = False, settings: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``PoolingEngine(model, max_length=max_length, engine_kwargs=...)``'s engine_kwargs for upstream's prefill;
    ``settings``: the bundled runner's other settings."""
    length = detect_family(model, max_length=max_length).max_length
    step = {"shapes": [[1, align(length)]]} if static else {"buckets": [length], "max_num_batched_tokens": length}
    return {"max_num_seqs": 1, "additional_config": {"rbln_retrieval": {**(settings or {}), **step}}}
