"""The bundled runner's settings: carried to the engine-core process inside vLLM's ``additional_config``.

Callers tune them through ``PoolingEngine(..., engine_kwargs={"additional_config": {"rbln_retrieval": {...}}})``:

- ``max_num_batched_tokens``: tokens per step, the largest bucket (default max(max_length, 4096));
- ``buckets``: host kernels: explicit token-count buckets (default: ``buckets.derive_buckets``, at most 16);
- ``shapes``: static kernels: explicit ``[rows, width]`` step shapes (default: ``rows.derive_shapes``, at most 16),
  each width a multiple of 64; ``row_width``: the width of multi-row shapes (default 256);
- ``host_row_width``: host kernels, layers vLLM's CPU attention kernel does not take only: prompts of up to this
  many tokens (64 is the measured choice) share rows and one block-diagonal masked attention call per layer
  (``host_attention``): 5x on batches of short queries here, but a short text's vector then depends on its step's
  other prompts by float rounding (about 1e-7), so it is off (0) unless asked for;
- ``step_cost_tokens``: a step's fixed cost in tokens, which the packing scheduler weighs against padding
  (default 64; raise it where a graph launch costs more than that much compute);
- ``kernels``: "host" (the host default: vLLM's CPU attention kernel over the step, else torch's fused CPU attention
  per packed prompt, and vLLM's C RMSNorm,
  called outside the graph, and BERT blocks' GELU and residual adds written in place) or "static" (everything in
  torch ops traced into the bucket graph, masked bucket attention included: what the NPU compiles, and always used
  there);
- ``host_compile_backend``: "none" (default: the host runs the same bucket-shaped forward without tracing it),
  "eager" (dynamo traces one graph per bucket) or "inductor"; ``strict_shapes`` always traces;
- ``one_request_per_step``: reproduce upstream vllm-rbln's prefill (one prompt per step padded to max_length);
- ``npu``: rbln target only: the NPU to build for (default: RBLN_FORCE_NPU_NAME, else the NPU's own name); its
  family picks the compile route (``rbln_runtime.family_of``);
- ``compile_only``: rbln target only: compile and cache every bucket graph for ``npu`` on a host without an NPU
  (``rbln-retrieval compile``); the graphs' outputs are meaningless there.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rbln_retrieval.backend import rows as row_shapes
from rbln_retrieval.backend.buckets import derive_buckets
from rbln_retrieval.backend.vllm_compat import NATIVE_CUSTOM_OPS

CONFIG_KEY = "rbln_retrieval"
DEFAULT_MAX_TOKENS_PER_STEP = 4096
# A step's fixed cost (graph launch, step bookkeeping) in tokens of compute: the packing scheduler splits a
# partly filled step into smaller buckets only where that saves more padding than the extra steps cost.
DEFAULT_STEP_COST_TOKENS = 64


def compile_only(engine_kwargs: dict[str, Any]) -> bool:
    """Whether vLLM engine arguments ask the bundled runner for a compile-only build."""
    return bool(((engine_kwargs.get("additional_config") or {}).get(CONFIG_KEY) or {}).get("compile_only"))


def cache_root() -> Path:
    return Path(os.environ.get("RBLN_RETRIEVAL_CACHE_DIR") or Path.home() / ".cache" / "rbln-retrieval" / "compile")


@dataclass(frozen=True)
class BundledConfig:
    target: Literal["host", "rbln"] = "host"
    buckets: tuple[int, ...] = ()  # tokens per graph
    rows: tuple[int, ...] = ()  # static kernels: rows per graph (its row width is bucket // rows); host: empty
    # "host": CPU kernels (vLLM's attention, else torch's per prompt; vLLM's RMSNorm); "static": torch ops only.
    kernels: Literal["host", "static"] = "host"
    # host target only: the torch.compile backend that runs the graphs ("eager" traces without codegen). "none"
    # skips tracing: about 0.5 s per bucket at every start, and the CPU gains nothing from an uncompiled trace.
    host_compile_backend: Literal["none", "eager", "inductor"] = "none"
    strict_shapes: bool = False
    # Upstream vllm-rbln's prefill: one request per step padded to a single bucket (for comparison only).
    one_request_per_step: bool = False
    step_cost_tokens: int = DEFAULT_STEP_COST_TOKENS
    # host kernels: prompts up to this many tokens share rows and one masked attention call per layer (0: off)
    host_row_width: int = 0
    compile_only: bool = False
    cache_key: dict[str, Any] = field(default_factory=dict)
    # The rbln target's pins: keyed, so builds for other NPUs, SDKs and snapshots coexist, and checked against the
    # cache's manifest (artifacts.check).
    npu: str | None = None
    sdk: str = ""  # rebel-compiler's version
    snapshot: str = ""  # the model files' content (artifacts.snapshot_fingerprint)
    cache_root: str = ""  # resolved when the engine starts, so a later change of the variable moves nothing

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> BundledConfig:
        raw = (vllm_config.additional_config or {}).get(CONFIG_KEY)
        if raw is None:
            raise RuntimeError("The bundled runner was loaded for an engine that did not ask for it.")
        return cls(**{**raw, "buckets": tuple(raw["buckets"]), "rows": tuple(raw.get("rows", ()))})

    @staticmethod
    def requested(vllm_config: Any) -> bool:
        return CONFIG_KEY in (getattr(vllm_config, "additional_config", None) or {})

    @property
    def shapes(self) -> list[row_shapes.Shape]:
        """(rows, width) per graph: the static kernels' row shapes, else one row per bucket."""
        counts = self.rows or (1,) * len(self.buckets)
        return [(r, b // r) for r, b in zip(counts, self.buckets)]

    @property
    def labels(self) -> list[int | str]:
        """How stats, logs and the artifact manifest name each graph: its tokens, or "rowsxwidth" (static)."""
        return [f"{r}x{w}" for r, w in self.shapes] if self.rows else list(self.buckets)

    def bucket_for(self, num_tokens: int) -> int:
        for bucket in self.buckets:
            if num_tokens <= bucket:
                return bucket
        raise RuntimeError(f"A step of {num_tokens} tokens exceeds the largest bucket ({self.buckets[-1]}).")

    @property
    def traced(self) -> bool:
        """Whether steps run through torch.compile: always on the NPU and under strict_shapes (which records the
        traced graphs), on the host only when a compile backend is chosen."""
        return self.target == "rbln" or self.strict_shapes or self.host_compile_backend != "none"

    def cache_dir(self) -> Path:
        """Compile artifacts for this model and configuration; the same key on the next start reuses them."""
        # Settings that change no graph leave the key alone: a compile-only build serves the NPU host's start.
        unkeyed = dict.fromkeys(("strict_shapes", "compile_only", "step_cost_tokens", "cache_root"))
        key = json.dumps({**asdict(self), **unkeyed}, sort_keys=True, default=str)
        # A hub model's key is "org/name@<commit>": the folder is named after "name", the hash covers the commit.
        name = Path(str(self.cache_key.get("model", "model"))).name.split("@")[0] or "model"
        return Path(self.cache_root or cache_root()) / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


TUNABLE = (
    "kernels",
    "host_compile_backend",
    "one_request_per_step",
    "step_cost_tokens",
    "compile_only",
    "host_row_width",
)


def _static_shapes(settings: dict[str, Any], max_length: int, max_tokens: int | None) -> list[row_shapes.Shape]:
    """The static kernels' step shapes: explicit ``shapes``, upstream's single prompt per step, or derived."""
    if "buckets" in settings:
        raise ValueError(
            "buckets sets the host kernels' token counts; static kernels (and device='rbln') take "
            "shapes=[[rows, width], ...] instead."
        )
    width = int(settings.pop("row_width", row_shapes.DEFAULT_ROW_WIDTH))
    explicit = settings.pop("shapes", None)
    if settings.get("one_request_per_step"):
        return [(1, row_shapes.align(max_length))]
    if explicit:
        return row_shapes.check_shapes(explicit, max_length)
    return row_shapes.derive_shapes(max_length, max_tokens or row_shapes.DEFAULT_ROW_STEP, width)


def engine_overrides(
    *,
    target: str,
    max_length: int,
    model: str,
    dtype: str,
    strict_shapes: bool,
    user: dict[str, Any],
    npu: str | None = None,
    sdk: str = "",
    snapshot: str = "",
) -> dict[str, Any]:
    """vLLM engine arguments for the bundled runner; ``user`` holds the caller's ``additional_config`` entry (less
    ``npu``), ``npu``, ``sdk`` and ``snapshot`` what the rbln target builds for (keyed, and pinned in the cache's
    manifest)."""
    settings = dict(user)
    one_per_step = bool(settings.get("one_request_per_step", False))
    # The NPU cannot run host kernels: it always takes the static path.
    static = target == "rbln" or settings.get("kernels") == "static"
    if target == "rbln":
        settings["kernels"] = "static"
    user_tokens = settings.pop("max_num_batched_tokens", None)
    row_counts: tuple[int, ...] = ()
    if static:
        shapes = _static_shapes(settings, max_length, None if user_tokens is None else int(user_tokens))
        buckets, row_counts = [r * w for r, w in shapes], tuple(r for r, _ in shapes)
    else:
        for name in ("shapes", "row_width"):
            if name in settings:
                raise ValueError(f"{name} shapes the static kernels' steps; the host kernels take buckets.")
        max_tokens = int(user_tokens or max(max_length, DEFAULT_MAX_TOKENS_PER_STEP))
        if one_per_step:
            # Upstream pads every prefill to one size; max_length is the smallest size that holds any prompt.
            max_tokens = max_length
        buckets = settings.pop("buckets", None) or derive_buckets(max_length, max_tokens)
        buckets = sorted({int(b) for b in buckets})
        if one_per_step:
            buckets = [max_tokens]
        if buckets[-1] < max_length or buckets[0] <= 0:
            raise ValueError(f"buckets {buckets} must be positive and reach max_length={max_length}.")
    from vllm import __version__ as vllm_version

    bundled = BundledConfig(
        target=target,  # type: ignore[arg-type]
        buckets=tuple(buckets),
        rows=row_counts,
        strict_shapes=strict_shapes,
        cache_key={"model": model, "dtype": dtype, "max_length": max_length, "vllm": vllm_version},
        npu=npu,
        sdk=sdk,
        snapshot=snapshot,
        cache_root=str(cache_root()),
        **{k: v for k, v in settings.items() if k in TUNABLE},
    )
    unknown = set(settings) - set(TUNABLE)
    if unknown:
        raise ValueError(f"Unknown bundled-runner settings {sorted(unknown)} in additional_config[{CONFIG_KEY!r}].")
    if bundled.compile_only and target != "rbln":
        raise ValueError("compile_only compiles for an NPU; it needs device='rbln'.")
    native = {"compilation_config": {"custom_ops": NATIVE_CUSTOM_OPS}} if static else {}
    return {
        **native,
        "worker_cls": "rbln_retrieval.backend.worker.BundledWorker",
        # Fills each step's budget before the runner pads it to a bucket.
        "scheduler_cls": "rbln_retrieval.backend.packing.PackingScheduler",
        # The runner compiles its own static graphs; vLLM's dynamic-shape compilation stays off.
        "enforce_eager": True,
        # Causal pooling models would otherwise get both on, putting KV context into steps; a context-free
        # step is what a static graph can run, and pooling requests never share a prompt prefix worth caching.
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "max_num_batched_tokens": max(buckets),
        **({"max_num_seqs": 1} if one_per_step else {}),
        "additional_config": {
            CONFIG_KEY: {**asdict(bundled), "buckets": list(bundled.buckets), "rows": list(bundled.rows)}
        },
    }
