"""torch.compile for the bundled runner: the target's backend, wrapped to count and (strictly) police compiles.

May import: the standard library, torch, ``rbln_retrieval.backend.npu.rbln_runtime`` (the only way to rebel).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rbln_retrieval.backend.npu import rbln_runtime

logger = logging.getLogger(__name__)


class CompileAfterWarmupError(RuntimeError):
    """strict_shapes: a graph was compiled while serving, i.e. a shape the warmup did not cover."""


@dataclass
class CompiledGraph:
    bucket: int | str | None  # the step's bucket (tokens, or static "rowsxwidth") when dynamo compiled it
    input_shapes: dict[str, tuple[int, ...]]  # graph placeholder -> shape (parameters left out)
    after_warmup: bool
    ops: list[str]  # what the graph calls, as dynamo hands it to the backend ("torch._C._nn.linear", "_C.onednn_mm")
    lifted_weights: int  # module parameters and buffers handed to the backend as graph inputs


def _is_static_input(value: Any) -> bool:
    """Dynamo marks the module parameters and buffers it lifts into graph inputs as static inputs."""
    return isinstance(value, torch.Tensor) and getattr(value, "_dynamo_static_input_type", None) is not None


def weights_as_module_state(
    gm: torch.fx.GraphModule, example_inputs: list[Any], shared: dict[int, torch.Tensor]
) -> tuple[torch.fx.GraphModule, list[int]]:
    """A copy of ``gm`` whose weights, which dynamo passes as graph inputs, are module state again (``get_attr``
    nodes on the same storage, as plain tensors: vLLM's parameter subclasses carry loader hooks a compiler has no
    use for), and the indices of the inputs that remain (the step's own). ``shared`` hands every graph the same
    tensor objects.

    vllm-rbln keeps weights out of the inputs with dynamo's ``inline_inbuilt_nn_modules`` off, a flag torch >= 2.6
    ignores (it always inlines, lifting every parameter and buffer). The NPU compiler takes weights as module
    state: one copy on the device, shared by every bucket graph compiled in one context.
    """
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    state = torch.fx.GraphModule(gm, graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    kept = []
    for index, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if not _is_static_input(value):
            kept.append(index)
            continue
        if id(value) not in shared:
            plain = value.as_subclass(torch.Tensor).detach()
            is_parameter = isinstance(value, torch.nn.Parameter)
            shared[id(value)] = torch.nn.Parameter(plain, requires_grad=False) if is_parameter else plain
        weight = shared[id(value)]
        if isinstance(weight, torch.nn.Parameter):
            state.register_parameter(node.name, weight)
        else:
            state.register_buffer(node.name, weight)
        with graph.inserting_before(node):
            attribute = graph.get_attr(node.name)
        node.replace_all_uses_with(attribute)
        graph.erase_node(node)
    graph.lint()
    state.recompile()
    return state, kept


def _op_name(target: Any) -> str:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)  # "aten.mm.default", "_C.onednn_mm.default"
    if isinstance(target, str):  # call_method
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    return f"{module}.{getattr(target, '__name__', repr(target))}".lstrip(".")


def graph_ops(gm: torch.fx.GraphModule) -> list[str]:
    return sorted({_op_name(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")})


@dataclass
class RecordingBackend:
    """Wraps a torch.compile backend; records every graph it is handed and, when strict, refuses late ones.
    torch.compile's ``options`` for the backend reach ``inner`` unchanged."""

    inner: Any
    strict: bool = False
    weights_as_state: bool = False  # hand ``inner`` the weights as module state, not as graph inputs
    current_bucket: int | str | None = None
    warmed_up: bool = False
    graphs: list[CompiledGraph] = field(default_factory=list)
    _weights: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)  # one tensor per weight, all graphs

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable[..., Any]:
        kept: Sequence[int] = range(len(example_inputs))
        if self.weights_as_state:
            gm, kept = weights_as_module_state(gm, example_inputs, self._weights)
        inputs = [example_inputs[i] for i in kept]
        names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        # Step inputs only: weights and 0-d constants do not depend on the step.
        shapes = {
            name: tuple(t.shape)
            for name, t in zip(names, inputs)
            if isinstance(t, torch.Tensor) and t.dim() > 0 and not _is_static_input(t)
        }
        lifted = sum(_is_static_input(t) for t in inputs)
        self.graphs.append(CompiledGraph(self.current_bucket, shapes, self.warmed_up, graph_ops(gm), lifted))
        if self.warmed_up:
            logger.warning("Compiling a graph after warmup (bucket %s): %s", self.current_bucket, shapes)
            if self.strict:
                raise CompileAfterWarmupError(
                    f"strict_shapes: a graph was compiled after warmup for bucket {self.current_bucket} "
                    f"with input shapes {shapes}."
                )
        inner = self.inner
        if isinstance(inner, str):
            from torch._dynamo.backends.registry import lookup_backend

            inner = lookup_backend(inner)
        compiled = inner(gm, inputs, **kwargs)
        if not self.weights_as_state:
            return compiled
        return lambda *args: compiled(*(args[i] for i in kept))

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


def recording_backend(
    bundled: Any, process_groups: dict[str, list[int]] | None = None
) -> tuple[RecordingBackend, rbln_runtime.CompileBackend]:
    """The target's compile backend (from rbln_runtime, the only module that touches rebel), recorded, and what
    torch.compile takes with it (options, fullgraph). ``process_groups``: vLLM's groups, for the Rebel100 route."""
    cache_dir = bundled.cache_dir()
    cache_dir.mkdir(parents=True, exist_ok=True)
    if bundled.target == "rbln":
        chosen = rbln_runtime.rbln_compile_backend(
            cache_dir,
            npu=bundled.npu,
            dtype=bundled.cache_key["dtype"],
            compile_only=bundled.compile_only,
            process_groups=process_groups or {},
            snapshot=bundled.snapshot,
        )
    else:
        chosen = rbln_runtime.host_compile_backend(bundled.host_compile_backend, cache_dir)
    recorder = RecordingBackend(chosen.backend, strict=bundled.strict_shapes, weights_as_state=bundled.target == "rbln")
    return recorder, chosen


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


@dataclass(frozen=True)
class GraphCost:
    """What one call of a bucket's forward computes, as torch's flop counter counts it."""

    flops: float
    attention_flops: float  # the batched matmuls: attention scores and weighted values
    largest_activation: int  # bytes of the largest tensor an op produces

    @property
    def linear_flops(self) -> float:
        return self.flops - self.attention_flops


def count_flops(fn: Callable[..., Any], *args: Any) -> GraphCost:
    """Run ``fn`` once on fake tensors (nothing is computed) under torch's flop counter."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    from torch.utils.flop_counter import FlopCounterMode

    class Largest(TorchDispatchMode):
        size = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.size = max(self.size, t.numel() * t.element_size())
            return out

    counter, largest = FlopCounterMode(display=False), Largest()
    with FakeTensorMode(allow_non_fake_inputs=True), counter, largest:
        fn(*args)
    by_op = counter.get_flop_counts().get("Global", {})
    attention = float(sum(n for op, n in by_op.items() if "bmm" in str(op)))
    return GraphCost(float(counter.get_total_flops()), attention, largest.size)
