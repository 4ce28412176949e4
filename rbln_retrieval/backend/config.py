"""The bundled runner's settings: what the caller asks for (``RunnerSettings``, typed and checked) and what the
engine-core process runs with (``BundledConfig``, carried there inside vLLM's ``additional_config``).

Callers tune the runner through ``PoolingEngine(..., engine_kwargs={"additional_config": {"rbln_retrieval": {...}}})``;
``RunnerSettings`` names every key it takes, and ``engine_overrides`` turns them into vLLM engine arguments. A key it
does not know, a choice outside its options or a number that is not one is refused in one sentence naming it.

Stages it may import: step, vllm_compat
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

from rbln_retrieval.backend.step import rows as row_shapes
from rbln_retrieval.backend.step.buckets import derive_buckets
from rbln_retrieval.backend.vllm_compat import NATIVE_CUSTOM_OPS

CONFIG_KEY = "rbln_retrieval"
DEFAULT_MAX_TOKENS_PER_STEP = 4096
# A step's fixed cost (graph launch, step bookkeeping) in tokens of compute: the packing scheduler splits a
# partly filled step into smaller buckets only where that saves more padding than the extra steps cost.
DEFAULT_STEP_COST_TOKENS = 64
Kernels = Literal["host", "static"]
HostCompileBackend = Literal["none", "eager", "inductor"]
# Settings of 0.1.0 that no longer change what runs, accepted with a warning for one release: what replaced each.
DEPRECATED = {
    "one_request_per_step": "upstream vllm-rbln's prefill is reproduced by bench/upstream_prefill.py",
}


@dataclass(frozen=True)
class RunnerSettings:
    """The caller's ``additional_config["rbln_retrieval"]`` (less ``npu``, which the engine resolves), typed.

    - ``max_num_batched_tokens``: tokens per step, the largest bucket (default max(max_length, 4096));
    - ``buckets``: host kernels: explicit token-count buckets (default: ``step.buckets.derive_buckets``, at most 16);
    - ``shapes``: static kernels: explicit ``[rows, width]`` step shapes (default: ``step.rows.derive_shapes``, at
      most 16), each width a multiple of 64; ``row_width``: the width of multi-row shapes (default 256);
    - ``step_cost_tokens``: a step's fixed cost in tokens, which the packing scheduler weighs against padding
      (default 64; raise it where a graph launch costs more than that much compute);
    - ``kernels``: "host" (the host default: vLLM's CPU attention kernel over the step, else torch's fused CPU
      attention per packed prompt, and vLLM's C RMSNorm, called outside the graph, and BERT blocks' GELU and
      residual adds written in place) or "static" (everything in torch ops traced into the bucket graph, masked
      bucket attention included: what the NPU compiles, and always used there);
    - ``host_compile_backend``: "none" (default: the host runs the same bucket-shaped forward without tracing it),
      "eager" (dynamo traces one graph per bucket) or "inductor"; ``strict_shapes`` always traces;
    - ``compile_only``: rbln target only: compile and cache every bucket graph for the NPU on a host without one
      (``rbln-retrieval compile``); the graphs' outputs are meaningless there.
    """

    max_num_batched_tokens: int | None = None
    buckets: tuple[int, ...] | None = None
    shapes: tuple[tuple[int, ...], ...] | None = None
    row_width: int | None = None
    step_cost_tokens: int = DEFAULT_STEP_COST_TOKENS
    kernels: Kernels = "host"
    host_compile_backend: HostCompileBackend = "none"
    compile_only: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> RunnerSettings:
        """``raw`` checked key by key: the first unknown key, bad choice or non-number is refused in one sentence."""
        names = {f.name for f in fields(cls)}
        unknown = set(raw) - names - set(DEPRECATED)
        if unknown:
            raise ValueError(f"Unknown bundled-runner settings {sorted(unknown)} in additional_config[{CONFIG_KEY!r}].")
        for name in sorted(set(raw) & set(DEPRECATED)):
            warnings.warn(f"{name} is deprecated and ignored: {DEPRECATED[name]}.", DeprecationWarning, stacklevel=4)
        values: dict[str, Any] = {}
        for name in (f.name for f in fields(cls) if f.name in raw):
            value = raw[name]
            if name in ("kernels", "host_compile_backend"):
                options = get_args(Kernels if name == "kernels" else HostCompileBackend)
                if value not in options:
                    raise ValueError(f"{_named(name, value)} is not one of {', '.join(map(repr, options))}.")
            elif name == "compile_only":
                if not isinstance(value, bool):
                    raise ValueError(f"{_named(name, value)} is not true or false.")
            elif name == "buckets":
                value = tuple(_integer(name, b, least=1) for b in _sequence(name, value))
            elif name == "shapes":
                value = tuple(tuple(_integer(name, x) for x in _sequence(name, s)) for s in _sequence(name, value))
            elif value is not None or name not in ("max_num_batched_tokens", "row_width"):
                value = _integer(name, value, least=0 if name == "step_cost_tokens" else 1)
            values[name] = value
        return cls(**values)


def _named(name: str, value: Any) -> str:
    return f"{name}={value!r} in additional_config[{CONFIG_KEY!r}]"


def _integer(name: str, value: Any, least: int | None = None) -> int:
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise ValueError(f"{_named(name, value)} is not a whole number.")
    if least is not None and value < least:
        raise ValueError(f"{_named(name, value)} is below {least}.")
    return int(value)


def _sequence(name: str, value: Any) -> list[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{_named(name, value)} is not a list.")
    return list(value)


def compile_only(engine_kwargs: dict[str, Any]) -> bool:
    """Whether vLLM engine arguments ask the bundled runner for a compile-only build."""
    return bool(((engine_kwargs.get("additional_config") or {}).get(CONFIG_KEY) or {}).get("compile_only"))


def cache_root() -> Path:
    return Path(os.environ.get("RBLN_RETRIEVAL_CACHE_DIR") or Path.home() / ".cache" / "rbln-retrieval" / "compile")


@dataclass(frozen=True)
class BundledConfig:
    """What the engine-core process runs with: the caller's settings resolved for the target and model (buckets or
    row shapes chosen, the cache keyed), carried there as a plain dict in ``additional_config``."""

    target: Literal["host", "rbln"] = "host"
    buckets: tuple[int, ...] = ()  # tokens per graph
    rows: tuple[int, ...] = ()  # static kernels: rows per graph (its row width is bucket // rows); host: empty
    # "host": CPU kernels (vLLM's attention, else torch's per prompt; vLLM's RMSNorm); "static": torch ops only.
    kernels: Kernels = "host"
    # host target only: the torch.compile backend that runs the graphs ("eager" traces without codegen). "none"
    # skips tracing, which costs time per bucket at every start and gains the CPU nothing without codegen.
    host_compile_backend: HostCompileBackend = "none"
    strict_shapes: bool = False
    step_cost_tokens: int = DEFAULT_STEP_COST_TOKENS
    gated_mlp: bool = True  # the model's MLP has gate, up and down matrices: the step cost's weight FLOPs per token
    compile_only: bool = False
    cache_key: dict[str, Any] = field(default_factory=dict)
    # The rbln target's pins: keyed, so builds for other NPUs, SDKs and snapshots coexist, and checked against the
    # cache's manifest (artifacts.check).
    npu: str | None = None
    sdk: str = ""  # rebel-compiler's version
    snapshot: str = ""  # the model files' content (artifacts.snapshot_fingerprint)
    cache_root: str = ""  # resolved when the engine starts, so a later change of the variable moves nothing

    @classmethod
    def from_fields(cls, raw: Mapping[str, Any]) -> BundledConfig:
        """The one place a BundledConfig is made: from ``resolve``'s fields in the caller's process, and in the
        engine-core process from the plain dict ``to_fields`` put into vLLM's ``additional_config``. Lists become
        the tuples the fields hold; a field it does not know is refused naming it."""
        unknown = sorted(set(raw) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(
                f"Unknown bundled-config fields {unknown} in additional_config[{CONFIG_KEY!r}]: the engine was "
                "configured by another version of rbln-retrieval."
            )
        tuples = {name: tuple(raw[name]) for name in ("buckets", "rows") if name in raw}
        return cls(**{**raw, **tuples})

    def to_fields(self) -> dict[str, Any]:
        """This config as the plain dict (JSON types) that crosses to the engine-core process; ``from_fields``
        reads it back equal."""
        return {**asdict(self), "buckets": list(self.buckets), "rows": list(self.rows)}

    @classmethod
    def from_vllm_config(cls, vllm_config: Any) -> BundledConfig:
        """The config ``resolve`` built, read back from vLLM's config in the engine-core process (which receives it
        as a plain dict): decoded once per process, however many stages ask for it."""
        raw = (vllm_config.additional_config or {}).get(CONFIG_KEY)
        if raw is None:
            raise RuntimeError("The bundled runner was loaded for an engine that did not ask for it.")
        return _decoded(json.dumps(raw, sort_keys=True))

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
        unkeyed = dict.fromkeys(("strict_shapes", "compile_only", "step_cost_tokens", "gated_mlp", "cache_root"))
        key = json.dumps({**asdict(self), **unkeyed}, sort_keys=True, default=str)
        # A hub model's key is "org/name@<commit>": the folder is named after "name", the hash covers the commit.
        name = Path(str(self.cache_key.get("model", "model"))).name.split("@")[0] or "model"
        return Path(self.cache_root or cache_root()) / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _static_shapes(settings: RunnerSettings, max_length: int) -> list[row_shapes.Shape]:
    """The static kernels' step shapes: explicit ``shapes``, or derived."""
    if settings.buckets is not None:
        raise ValueError(
            "buckets sets the host kernels' token counts; static kernels (and device='rbln') take "
            "shapes=[[rows, width], ...] instead."
        )
    if settings.shapes:
        return row_shapes.check_shapes(settings.shapes, max_length)
    width = row_shapes.DEFAULT_ROW_WIDTH if settings.row_width is None else settings.row_width
    return row_shapes.derive_shapes(max_length, settings.max_num_batched_tokens or row_shapes.DEFAULT_ROW_STEP, width)


def _host_buckets(settings: RunnerSettings, max_length: int) -> list[int]:
    """The host kernels' token-count buckets: explicit ``buckets``, or derived up to the step's budget."""
    for name in ("shapes", "row_width"):
        if getattr(settings, name) is not None:
            raise ValueError(f"{name} shapes the static kernels' steps; the host kernels take buckets.")
    max_tokens = settings.max_num_batched_tokens or max(max_length, DEFAULT_MAX_TOKENS_PER_STEP)
    buckets = sorted(set(settings.buckets or derive_buckets(max_length, max_tokens)))
    if buckets[-1] < max_length:
        raise ValueError(f"buckets {buckets} must be positive and reach max_length={max_length}.")
    return buckets


@functools.lru_cache(maxsize=8)
def _decoded(wire: str) -> BundledConfig:
    return BundledConfig.from_fields(json.loads(wire))


def resolve(
    *,
    target: str,
    max_length: int,
    model: str,
    dtype: str,
    strict_shapes: bool,
    user: Mapping[str, Any],
    npu: str | None = None,
    sdk: str = "",
    snapshot: str = "",
    gated_mlp: bool = True,
) -> BundledConfig:
    """The bundled runner's config for an engine: ``user`` holds the caller's ``additional_config`` entry (less
    ``npu``, read as ``RunnerSettings``), ``npu``, ``sdk`` and ``snapshot`` what the rbln target builds for (keyed,
    and pinned in the cache's manifest)."""
    settings = RunnerSettings.parse(user)
    # The NPU cannot run host kernels: it always takes the static path.
    static = target == "rbln" or settings.kernels == "static"
    row_counts: tuple[int, ...] = ()
    if static:
        shapes = _static_shapes(settings, max_length)
        buckets, row_counts = [r * w for r, w in shapes], tuple(r for r, _ in shapes)
    else:
        buckets = _host_buckets(settings, max_length)
    if settings.compile_only and target != "rbln":
        raise ValueError("compile_only compiles for an NPU; it needs device='rbln'.")
    from vllm import __version__ as vllm_version

    return BundledConfig.from_fields(
        {
            "target": target,
            "buckets": buckets,
            "rows": row_counts,
            "kernels": "static" if static else "host",
            "host_compile_backend": settings.host_compile_backend,
            "strict_shapes": strict_shapes,
            "step_cost_tokens": settings.step_cost_tokens,
            "gated_mlp": gated_mlp,
            "compile_only": settings.compile_only,
            "cache_key": {"model": model, "dtype": dtype, "max_length": max_length, "vllm": vllm_version},
            "npu": npu,
            "sdk": sdk,
            "snapshot": snapshot,
            "cache_root": str(cache_root()),
        }
    )


def engine_arguments(bundled: BundledConfig) -> dict[str, Any]:
    """vLLM engine arguments that run ``bundled`` on the bundled runner; the config travels to the engine-core
    process inside ``additional_config`` (``BundledConfig.from_vllm_config`` reads it back there)."""
    native = {"compilation_config": {"custom_ops": NATIVE_CUSTOM_OPS}} if bundled.kernels == "static" else {}
    return {
        **native,
        "worker_cls": "rbln_retrieval.backend.engine_core.worker.BundledWorker",
        # Fills each step's budget before the runner pads it to a bucket.
        "scheduler_cls": "rbln_retrieval.backend.engine_core.scheduler.PackingScheduler",
        # The runner compiles its own static graphs; vLLM's dynamic-shape compilation stays off.
        "enforce_eager": True,
        # Causal pooling models would otherwise get both on, putting KV context into steps; a context-free
        # step is what a static graph can run, and pooling requests never share a prompt prefix worth caching.
        "enable_chunked_prefill": False,
        "enable_prefix_caching": False,
        "max_num_batched_tokens": max(bundled.buckets),
        "additional_config": {CONFIG_KEY: bundled.to_fields()},
    }


def engine_overrides(**resolve_args: Any) -> dict[str, Any]:
    """``engine_arguments(resolve(...))``: the engine arguments for the caller's settings in one call."""
    return engine_arguments(resolve(**resolve_args))
