"""The NPU graph contract both stand-in routes check (test-only): each graph is lowered to ATen and checked against
the rules of ``rebel.rules`` (the SDK's, each with its source, and this package's own stricter ones; which apply
is chosen there): ATen ops only, static shapes, the SDK's dtypes; for our graphs also no int64, no write into a graph
input, weights as contiguous non-empty module state, 64-aligned inputs, no bool inversion, no 0-d reduction, no
zero-size tensor. Capture is ``make_fx`` after functionalization, or ``torch.export`` where ``make_fx`` cannot trace
the module (transformers' data-dependent mask checks). It also counts each graph's FLOPs (torch's flop counter, on
fake tensors) and its largest activation, and the FLOPs of every call the runtimes execute (``EXECUTED``).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

ALLOWED_NAMESPACES = {"aten", "prims", "rbln_custom_ops"}
from rebel import rules

ALLOWED_DTYPES = {torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.bool}  # ours (rule no-int64)
SDK_DTYPES = ALLOWED_DTYPES | {torch.int64}  # the SDK's (rule sdk-dtypes)
ALIGN = 64
INVERSIONS = {"aten.bitwise_not.default", "aten.logical_not.default"}
REDUCTIONS = ("aten.sum.", "aten.mean.", "aten.amax.", "aten.amin.", "aten.max.", "aten.min.", "aten.any.", "aten.all.",
              "aten.prod.", "aten.argmax.", "aten.argmin.")
MODULE_STATE_MARKERS = ("_parameters_", "_buffers_", "_modules_")


class GraphContractError(RuntimeError):
    """A graph the NPU compiler could not take."""


@dataclass
class Compiled:
    route: str  # "aot" (compile_from_torch) or "torch.compile" (rbln_backend)
    ops: list[str]  # "aten.mm.default", ... of the lowered graph (empty for a cache hit)
    input_shapes: list[tuple[int, ...]]
    input_dtypes: list[str]
    weights: int  # parameters and buffers held as module state
    weight_storages: frozenset[int]  # their data pointers: equal across graphs that share one copy
    options: dict[str, Any]  # torch.compile's options, or compile_from_torch's keyword arguments
    rbln_devices: str | None  # RBLN_VISIBLE_DEVICES as the compiler saw it
    legacy_devices: str | None  # RBLN_DEVICES as the compiler saw it (SDK 0.12 hosts unset it)
    cached: bool = False  # taken from the compile cache, nothing lowered
    violations: list[str] = field(default_factory=list)
    flops: float = 0.0  # one call, as torch.utils.flop_counter counts the lowered graph
    largest_activation: int = 0  # bytes of the largest tensor an op of the lowered graph produces
    input_names: list[str] = field(default_factory=list)  # as input_info names them (compile_from_torch)


COMPILED: list[Compiled] = []  # every graph either route was handed, in order
EXECUTED: list[float] = []  # the FLOPs of every runtime call, in order (a graph's FLOPs per call it ran)


def lower(gm: torch.nn.Module, example_inputs: list[Any]) -> torch.fx.GraphModule:
    try:
        return make_fx(torch.func.functionalize(gm, remove="mutations_and_views"), tracing_mode="real")(*example_inputs)
    except Exception as make_fx_error:  # e.g. a data-dependent branch on a real tensor's values
        try:
            exported = torch.export.export(gm, tuple(example_inputs), strict=False).run_decompositions()
        except Exception:
            raise make_fx_error from None
        return make_fx(exported.module(), tracing_mode="real")(*example_inputs)


def op_names(lowered: torch.fx.GraphModule) -> list[str]:
    return sorted(
        {str(n.target) for n in lowered.graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}
    )


def violations(gm: torch.nn.Module, lowered: torch.fx.GraphModule, example_inputs: list[Any],
               names: list[str] | None = None) -> list[str]:
    """What ``gm`` (lowered to ``lowered``) breaks of the active rules; ``names``: its inputs' (else its graph's
    placeholders, or its ``forward``'s parameters)."""
    found = []
    dtypes = ALLOWED_DTYPES if rules.enforced("no-int64") else SDK_DTYPES
    graph = getattr(gm, "graph", None)  # a captured graph, or a plain module (compile_from_torch takes either)
    if names is None:
        names = [n.name for n in graph.nodes if n.op == "placeholder"] if graph else list(inspect.signature(gm.forward).parameters)
    for name, value in zip(names, example_inputs):
        state = isinstance(value, torch.nn.Parameter) or any(m in name for m in MODULE_STATE_MARKERS)
        if state and rules.enforced("weights-as-state"):
            found.append(f"weight passed as graph input: {name}")
        if isinstance(value, torch.Tensor) and value.dtype not in dtypes:
            found.append(f"input {name} has dtype {value.dtype}")
        aligned = not isinstance(value, torch.Tensor) or not value.dim() or not value.shape[-1] % ALIGN
        if not aligned and rules.enforced("align-64"):
            found.append(f"input {name} has last dimension {value.shape[-1]}, not a multiple of {ALIGN}")
    for name, tensor in [*gm.named_parameters(), *gm.named_buffers()]:
        if tensor.numel() == 0 and rules.enforced("weights-as-state"):
            found.append(f"empty weight: {name}")
        if not tensor.is_contiguous() and rules.enforced("contiguous-weights"):
            found.append(f"non-contiguous weight: {name}")
        if tensor.dtype not in dtypes:
            found.append(f"weight {name} has dtype {tensor.dtype}")
    placeholders = {n for n in lowered.graph.nodes if n.op == "placeholder"}
    for node in lowered.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if target.namespace not in ALLOWED_NAMESPACES:
                found.append(f"op outside ATen: {target}")
            written = target is torch.ops.aten.copy_.default and node.args[0] in placeholders
            if written and rules.enforced("no-input-writes"):
                found.append(f"write into graph input {node.args[0].name}")
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        if value.dtype not in dtypes:
            found.append(f"{node.name} has dtype {value.dtype}")
        inverts = str(target) in INVERSIONS and node.args[0].meta["val"].dtype == torch.bool
        if inverts and rules.enforced("no-bool-inversion"):
            found.append(f"{node.name} inverts a bool mask ({target})")
        if str(target).startswith(REDUCTIONS) and value.dim() == 0 and rules.enforced("no-0d-reduction"):
            found.append(f"{node.name} reduces to a 0-d tensor ({target})")
        if any(not isinstance(d, int) for d in value.shape):
            found.append(f"{node.name} has a symbolic shape {tuple(value.shape)}")
        elif value.numel() == 0 and rules.enforced("no-zero-size"):
            found.append(f"{node.name} is a zero-size tensor {tuple(value.shape)} ({target})")
    return sorted(set(found))


def cost(lowered: torch.fx.GraphModule, example_inputs: list[Any]) -> tuple[float, int]:
    """(FLOPs, largest activation in bytes) of one call of the lowered graph, run on fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, counter:
        torch.fx.Interpreter(lowered).run(*(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs))
    sizes = [v.numel() * v.element_size() for n in lowered.graph.nodes
             if n.op == "call_function" and isinstance(v := n.meta.get("val"), torch.Tensor)]
    return float(counter.get_total_flops()), max(sizes, default=0)


def record(route: str, gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any],
           lowered: torch.fx.GraphModule | None, found: list[str], names: list[str] | None = None) -> Compiled:
    """Record what a route was handed; raise if it breaks the contract."""
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    weights = [*gm.parameters(), *gm.buffers()]
    flops, largest = cost(lowered, example_inputs) if lowered is not None else (0.0, 0)
    compiled = Compiled(
        flops=flops,
        largest_activation=largest,
        route=route,
        ops=op_names(lowered) if lowered is not None else [],
        input_shapes=[tuple(t.shape) for t in tensors],
        input_dtypes=[str(t.dtype) for t in tensors],
        weights=len(weights),
        weight_storages=frozenset(t.data_ptr() for t in weights),
        options=options,
        rbln_devices=os.environ.get("RBLN_VISIBLE_DEVICES"),
        legacy_devices=os.environ.get("RBLN_DEVICES"),
        cached=lowered is None,
        violations=found,
        input_names=list(names or []),
    )
    COMPILED.append(compiled)
    if found:
        raise GraphContractError("; ".join(found))
    return compiled
