"""A model family's preset as vLLM engine arguments, shared by the in-process engine and `rbln-retrieval serve`.

Imports: cpu_features, engines (options), models (families); backend (its front door) inside the function that
needs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rbln_retrieval import cpu_features
from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.models.families import ModelFamily

# vLLM's own thread binding: its CPU executor spawns a worker process to apply them before OpenMP starts.
THREAD_VARS = ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU")


def executor_backend() -> str:
    """vLLM's executor for one engine: its worker inside the engine-core process ("uni"), computing on every core
    the process may use, unless the caller set vLLM's thread-binding variables, which only the worker process of
    vLLM's "mp" executor applies (it reserves one core for the engine core, unless told otherwise). A worker
    process is a third process per engine: a second import of torch and vLLM at every start, and its own memory."""
    return "mp" if any(name in os.environ for name in THREAD_VARS) else "uni"


def resolve_dtype(dtype: str, device: str) -> str:
    """``"auto"`` on the CPU: bfloat16 where the CPU multiplies it natively (AVX512_BF16 or AMX), else float32;
    an explicit bfloat16 on a CPU that emulates it runs, with one warning per process.

    vLLM's own "auto" turns float32 checkpoints into float16, which x86 CPUs emulate slowly. Pooling and
    normalization stay in float32 either way (bench/ measures the cosine against float32).
    """
    if device != "cpu":
        return dtype
    if dtype == "auto":
        return "bfloat16" if cpu_features.native_bf16() else "float32"
    if dtype == "bfloat16" and not cpu_features.native_bf16():
        cpu_features.warn_emulated_bf16()
    return dtype


def vllm_engine_kwargs(
    model_dir: str | Path,
    family: ModelFamily,
    options: EngineOptions,
    *,
    device: str,
    in_process: bool,
    model_key: str | None = None,
) -> dict[str, Any]:
    """Keyword arguments for vllm.AsyncEngineArgs (names match vLLM's CLI flags with dashes) for ``options`` on the
    resolved ``device``, run in the calling process or (``in_process=False``) in vLLM's engine-core process.

    The bundled runner adds its settings for its target ("host" or "rbln"); its own options (buckets, attention,
    ...) come from ``engine_kwargs["additional_config"]["rbln_retrieval"]``. ``model_key`` names the model in the
    compile-cache key (``ModelSource``'s ``id@commit``; default: ``model_dir``).
    """
    extra = {"distributed_executor_backend": "uni" if in_process else executor_backend(), **options.engine_kwargs}
    dtype = resolve_dtype(options.dtype, device)
    target = options.target(device)
    if target is None:
        return _stock_kwargs(model_dir, family, options, dtype, extra)
    from rbln_retrieval import backend

    bundled = backend.engine_args_for(
        target,
        model_dir=model_dir,
        model=model_key or str(model_dir),
        max_length=family.tokens.max_length,
        dtype=dtype,
        strict_shapes=options.strict_shapes,
        additional_config=extra.pop("additional_config", None),
        max_num_batched_tokens=extra.pop("max_num_batched_tokens", None),
        gated_mlp=family.graph.gated_mlp,
    )
    kwargs = _stock_kwargs(model_dir, family, options, dtype, extra)
    kwargs["kv_cache_memory_bytes"] = _kv_cache_bytes(family, bundled["max_num_batched_tokens"])
    return {**kwargs, **bundled}


def _stock_kwargs(
    model_dir: str | Path, family: ModelFamily, options: EngineOptions, dtype: str, extra: dict[str, Any]
) -> dict[str, Any]:
    max_num_batched_tokens = max(family.tokens.max_length, 8192)
    pooler: dict[str, Any] = {"task": family.pooling_task}
    if family.pool.pooling is not None:
        pooler["seq_pooling_type"] = family.pool.pooling
    kwargs: dict[str, Any] = {
        "model": str(model_dir),
        "runner": "pooling",
        "convert": family.pooling_task,
        "dtype": dtype,
        "max_model_len": family.tokens.max_length,
        # A step holds whole prompts (encoders are never chunked). Causal pooling models would be: vLLM 0.30's
        # scheduler then keeps part-prefilled prompts' blocks across steps and, with the cache sized below, never
        # finishes a call of 40 mixed-length texts (the stock runner stepped without end on a causal reranker).
        "max_num_batched_tokens": max_num_batched_tokens,
        "enable_chunked_prefill": False,
        # Pooling requests finish in the step that schedules them: the cache only ever holds one step's tokens.
        # (vLLM's CPU default reserves a fraction of all memory, which fails once a few engines are running.)
        "kv_cache_memory_bytes": _kv_cache_bytes(family, max_num_batched_tokens),
        "pooler_config": pooler,
        "hf_overrides": dict(family.graph.hf_overrides),
        "trust_remote_code": options.trust_remote_code,
        # Pickle checkpoints can run code on load; safetensors only unless the caller opts in. Heads that exist only
        # as .pt state dicts (``FamilySpec.loads_pickle_heads``): vLLM reads them with torch's weights-only
        # unpickler, which refuses code, while the model's own weights still come from safetensors (check_weights
        # made sure they exist).
        "load_format": "auto" if options.allow_pickle or family.spec.loads_pickle_heads else "safetensors",
        "disable_log_stats": True,
        # A library's users see their own progress bars; vLLM's checkpoint-loading bar is noise at every start.
        "use_tqdm_on_load": False,
        # Texts reach vLLM as token ids (text/tokens.py tokenizes them), so vLLM's own tokenizer would be a second
        # load at every start, copied again for its renderer. Image-text models keep it: vLLM's processors place
        # the image tokens with it.
        "skip_tokenizer_init": not family.embeds_images,
    }
    kwargs.update(extra)
    return kwargs


def _kv_cache_bytes(family: ModelFamily, max_num_batched_tokens: int) -> int:
    return max(64 << 20, int(family.graph.kv_bytes_per_token * max_num_batched_tokens * 1.25))
