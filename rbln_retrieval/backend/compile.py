"""torch.compile for the bundled runner: the target's backend, wrapped to count and (strictly) police compiles."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)


class CompileAfterWarmupError(RuntimeError):
    """strict_shapes: a graph was compiled while serving, i.e. a shape the warmup did not cover."""


@dataclass
class CompiledGraph:
    bucket: int | None  # the step's bucket when dynamo compiled this graph
    input_shapes: dict[str, tuple[int, ...]]  # graph placeholder -> shape (parameters left out)
    after_warmup: bool


@dataclass
class RecordingBackend:
    """Wraps a torch.compile backend; records every graph it is handed and, when strict, refuses late ones."""

    inner: Any
    options: dict[str, Any] | None = None
    strict: bool = False
    current_bucket: int | None = None
    warmed_up: bool = False
    graphs: list[CompiledGraph] = field(default_factory=list)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        # Step inputs only: lifted parameters, buffers and 0-d constants do not depend on the step.
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        shapes = {
            name: tuple(t.shape)
            for name, t in zip(names, example_inputs)
            if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and t.dim() > 0
            and "_modules_" not in name and "_parameters_" not in name and "_buffers_" not in name
        }
        self.graphs.append(CompiledGraph(self.current_bucket, shapes, self.warmed_up))
        if self.warmed_up:
            logger.warning("Compiling a graph after warmup (bucket %s): %s", self.current_bucket, shapes)
            if self.strict:
                raise CompileAfterWarmupError(
                    f"strict_shapes: a graph was compiled after warmup for bucket {self.current_bucket} "
                    f"with input shapes {shapes}."
                )
        if isinstance(self.inner, str):
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend(self.inner)(gm, example_inputs)
        if self.options is not None:
            return self.inner(gm, example_inputs, options=dict(self.options))
        return self.inner(gm, example_inputs)

    @property
    def compiles_after_warmup(self) -> int:
        return sum(g.after_warmup for g in self.graphs)


@contextmanager
def strict_errors() -> Iterator[None]:
    """Surface a strict_shapes refusal as itself instead of dynamo's BackendCompilerFailed wrapper."""
    try:
        yield
    except torch._dynamo.exc.BackendCompilerFailed as exc:
        if isinstance(exc.inner_exception, CompileAfterWarmupError):
            raise exc.inner_exception from None
        raise


def recording_backend(bundled: Any) -> RecordingBackend:
    """The target's compile backend (from rbln_runtime, the only module that touches rebel), recorded."""
    from rbln_retrieval.backend import rbln_runtime

    cache_dir = bundled.cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    if bundled.target == "rbln":
        chosen = rbln_runtime.rbln_compile_backend(cache_dir)
    else:
        chosen = rbln_runtime.host_compile_backend(bundled.host_compile_backend, cache_dir)
    return RecordingBackend(chosen.backend, chosen.options, strict=bundled.strict_shapes)


MANIFEST = "graphs.json"


def write_manifest(cache_dir: Path, buckets: list[int], graphs: list[CompiledGraph]) -> None:
    """Record what warmup compiled next to the backend's artifacts (rebel's .rbln files, inductor's FX cache);
    a start that finds it is reusing a warmed configuration. The host's "eager" backend keeps no artifacts."""
    manifest = {
        "buckets": buckets,
        "torch": torch.__version__,
        "graphs": [{"bucket": g.bucket, "input_shapes": g.input_shapes} for g in graphs],
    }
    tmp = cache_dir / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(cache_dir / MANIFEST)


def graph_breaks() -> int:
    """Graph breaks dynamo has recorded in this process (the engine-core process holds only our graphs)."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def allow_recompiles(count: int) -> None:
    """One guarded graph per bucket: raise dynamo's per-frame cache limit, which would otherwise fall back to
    eager silently after 8 shapes."""
    import torch._dynamo.config as dynamo_config

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), count))
