"""A model family's preset as vLLM engine arguments, shared by the in-process engine and `rbln-retrieval serve`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbln_retrieval.families import ModelFamily


def vllm_engine_kwargs(
    model_dir: str | Path,
    family: ModelFamily,
    *,
    dtype: str = "auto",
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for vllm.AsyncEngineArgs (names match vLLM's CLI flags with dashes)."""
    max_num_batched_tokens = max(family.max_length, 8192)
    pooler: dict[str, Any] = {"task": family.pooling_task}
    if family.pooling is not None:
        pooler["seq_pooling_type"] = family.pooling
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "runner": "pooling",
        "convert": family.pooling_task,
        "dtype": dtype,
        "max_model_len": family.max_length,
        # Encoders are not chunked: a step must hold a whole prompt.
        "max_num_batched_tokens": max_num_batched_tokens,
        # Pooling requests finish in the step that schedules them: the cache only ever holds one step's tokens.
        # (vLLM's CPU default reserves a fraction of all memory, which fails once a few engines are running.)
        "kv_cache_memory_bytes": max(64 << 20, int(family.kv_bytes_per_token * max_num_batched_tokens * 1.25)),
        "pooler_config": pooler,
        "hf_overrides": dict(family.hf_overrides),
        "trust_remote_code": trust_remote_code,
        # Pickle checkpoints can run code on load; safetensors only unless the caller opts in.
        "load_format": "auto" if allow_pickle else "safetensors",
        "disable_log_stats": True,
        # One worker: run it inside the engine-core process instead of spawning another one (seconds at start).
        "distributed_executor_backend": "uni",
    }
    kwargs.update(extra or {})
    return kwargs
