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
    runner: str = "stock",
    target: str = "host",
    strict_shapes: bool = False,
) -> dict[str, Any]:
    """Keyword arguments for vllm.AsyncEngineArgs (names match vLLM's CLI flags with dashes).

    ``runner="bundled"`` adds the bundled backend's settings for ``target`` ("host" or "rbln"); its own options
    (buckets, attention, ...) come from ``extra["additional_config"]["rbln_retrieval"]``.
    """
    extra = dict(extra or {})
    if runner == "bundled":
        from rbln_retrieval.backend.config import CONFIG_KEY, engine_overrides

        additional = dict(extra.pop("additional_config", None) or {})
        settings = dict(additional.pop(CONFIG_KEY, None) or {})
        if "max_num_batched_tokens" in extra:
            settings["max_num_batched_tokens"] = extra.pop("max_num_batched_tokens")
        bundled = engine_overrides(
            target=target, max_length=family.max_length, model=str(model_dir), dtype=dtype,
            strict_shapes=strict_shapes, user=settings,
        )
        bundled["additional_config"] = {**additional, **bundled["additional_config"]}
        kwargs = vllm_engine_kwargs(
            model_dir, family, dtype=dtype, trust_remote_code=trust_remote_code, allow_pickle=allow_pickle, extra=extra
        )
        kwargs["kv_cache_memory_bytes"] = _kv_cache_bytes(family, bundled["max_num_batched_tokens"])
        return {**kwargs, **bundled}
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
        "kv_cache_memory_bytes": _kv_cache_bytes(family, max_num_batched_tokens),
        "pooler_config": pooler,
        "hf_overrides": dict(family.hf_overrides),
        "trust_remote_code": trust_remote_code,
        # Pickle checkpoints can run code on load; safetensors only unless the caller opts in.
        "load_format": "auto" if allow_pickle else "safetensors",
        "disable_log_stats": True,
        # A library's users see their own progress bars; vLLM's checkpoint-loading bar is noise at every start.
        "use_tqdm_on_load": False,
        # One worker: run it inside the engine-core process instead of spawning another one (seconds at start).
        "distributed_executor_backend": "uni",
    }
    kwargs.update(extra)
    return kwargs


def _kv_cache_bytes(family: ModelFamily, max_num_batched_tokens: int) -> int:
    return max(64 << 20, int(family.kv_bytes_per_token * max_num_batched_tokens * 1.25))
