"""Stand-in for rebel's ahead-of-time compile (the ATOM route; test-only), as optimum-rbln 0.12 and this package
call it: ``compile_from_torch(module, input_info, npu=, num_devices=, ...)`` takes one ``input_info`` (a list of
``(name, shape, dtype)``) or a list of them, one per sequence-length bucket (optimum's ``max_seq_len`` list). Each
bucket is checked against the module's real inputs (names from its ``forward`` where it names them, else by
position as optimum's ``forward(*args)`` wrappers take them; shapes and dtypes from the example inputs and from the
shapes dynamo recorded on a captured graph), lowered to ATen and checked (``rebel.contract``, under the rules of
``rebel.rules``). ``compile`` is the step after capture, with the signature optimum-rbln and vllm-rbln inspect
(``num_devices``, ``dtype``). The compiled model saves to / loads from a ``.rbln`` file; ``Runtime`` checks each
call against ``input_info``, dispatches by shape to its bucket's graph, runs it on the CPU, counts its FLOPs and
returns a tensor (one output) or a list, written into ``out=`` buffers when given.
"""

from __future__ import annotations

import inspect
import json
import os
from typing import Any

import torch

from rebel import contract

RUNTIMES: list[dict[str, Any]] = []  # every runtime created: device, visible devices, artifact
LOADED: list[str] = []  # every .rbln file loaded
# A file each runtime created appends its record to (with its process and input shapes), one JSON line each.
RUNTIME_LOG_ENV = "REBEL_STANDIN_RUNTIME_LOG"

Bucket = list[tuple[str, list[int], str]]


class InputInfoError(TypeError):
    """``input_info`` does not describe the module's inputs."""


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def buckets(input_info: list) -> list[Bucket]:
    """``input_info`` as a list of buckets: one (name, shape, dtype) entry per input, one list per bucket."""
    several = bool(input_info) and not isinstance(input_info[0][0], str)
    return [[(e[0], list(e[1]), e[2]) for e in bucket] for bucket in (input_info if several else [input_info])]


def _recorded_shapes(module: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes dynamo recorded on a captured graph's inputs (none for a plain module)."""
    graph = getattr(module, "graph", None)
    found = {}
    for node in graph.nodes if graph is not None else []:
        value = node.meta.get("example_value", node.meta.get("val")) if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            found[str(node.target)] = (tuple(value.shape), value.dtype)
    return found


def _named_inputs(module: torch.nn.Module) -> list[str] | None:
    """The names ``forward`` gives its inputs; None where it takes ``*args`` (matched by position)."""
    parameters = inspect.signature(module.forward).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_KEYWORD]


def input_info_errors(module: torch.nn.Module, input_info: Bucket, example_inputs: list | None) -> list[str]:
    names = _named_inputs(module)
    given = [entry[0] for entry in input_info]
    if names is not None and given != names:
        return [f"input_info names {given} are not the module's inputs {names}"]
    found = []
    recorded = _recorded_shapes(module)
    for index, (name, shape, dtype) in enumerate(input_info):
        wanted = (tuple(shape), _dtype(dtype))
        if name in recorded and recorded[name] != wanted:
            found.append(f"input_info {name} {wanted} but the module takes {recorded[name]}")
        if example_inputs is not None:
            example = example_inputs[index]
            if (tuple(example.shape), example.dtype) != wanted:
                found.append(f"input_info {name} {wanted} but the example is {(tuple(example.shape), example.dtype)}")
    return found


class RBLNCompiledModel:
    """A compiled module, one lowered graph per bucket: built by ``compile`` or loaded from a ``.rbln`` path."""

    def __init__(self, path: str | None = None, *, graphs: list | None = None, input_info: list | None = None,
                 npu: str | None = None, options: dict[str, Any] | None = None):
        if path is not None:
            # Real tensors even when called from inside a torch.compile backend: torch.load makes meta tensors while
            # dynamo's tracing context (and its fake mode) is active.
            with torch._guards.tracing(None):
                saved = torch.load(path, weights_only=False)
            graphs, input_info, npu, options = saved["graphs"], saved["input_info"], saved["npu"], saved["options"]
            LOADED.append(path)
        self.graphs, self.npu, self.options = list(graphs or []), npu, dict(options or {})
        self.input_info = buckets(input_info or [])
        self.flops: dict[int, float] = {}  # bucket -> FLOPs of one call, counted on its first call

    def save(self, path: str) -> None:
        torch.save({"graphs": self.graphs, "input_info": self.input_info, "npu": self.npu, "options": self.options},
                   path)

    def create_runtime(self, device: int = 0, tensor_type: str = "np", **kwargs: Any) -> Runtime:
        return Runtime(self, device=device, tensor_type=tensor_type, **kwargs)


class Runtime:
    """rebel's runtime as optimum-rbln creates it: ``Runtime(compiled, tensor_type="pt", device=,
    activate_profiler=, timeout=)``."""

    def __init__(self, model: RBLNCompiledModel, tensor_type: str = "np", device: int | list[int] | None = None,
                 activate_profiler: bool | None = None, timeout: int | None = None, **_: Any):
        import rebel

        if tensor_type != "pt":
            raise TypeError(f"tensor_type={tensor_type!r}: the callers here pass torch tensors ('pt')")
        device = 0 if device is None else device  # optimum-rbln passes None for "the first NPU"
        for index in [device] if isinstance(device, int) else device:
            if not 0 <= index < rebel.device_count():
                raise RuntimeError(f"device {index} is not an NPU of this host ({rebel.device_count()} present)")
        self.model, self.device, self.activate_profiler, self.timeout = model, device, activate_profiler, timeout
        RUNTIMES.append(
            {"device": device, "visible": os.environ.get("RBLN_VISIBLE_DEVICES"), "legacy": os.environ.get("RBLN_DEVICES"), "npu": model.npu}
        )
        if log := os.environ.get(RUNTIME_LOG_ENV):  # for a test that sees the runtimes of other processes
            shapes = [list(shape) for _, shape, _ in model.input_info[0]] if model.input_info else []
            with open(log, "a", encoding="utf-8") as out:
                out.write(json.dumps({**RUNTIMES[-1], "pid": os.getpid(), "shapes": shapes}) + "\n")

    def _bucket(self, args: tuple[torch.Tensor, ...]) -> int:
        first = self.model.input_info[0]
        if missing := [e[0] for e, a in zip(first, args) if not isinstance(a, torch.Tensor)]:
            raise InputInfoError(f"inputs {missing} are not tensors")
        wanted = [(tuple(a.shape), a.dtype) for a in args]
        for index, info in enumerate(self.model.input_info):
            if wanted == [(tuple(shape), _dtype(dtype)) for _, shape, dtype in info]:
                return index
        if len(args) != len(first):
            raise InputInfoError(f"{len(args)} inputs for an input_info of {len(first)}")
        name, shape, dtype = next(e for e, w in zip(first, wanted) if (tuple(e[1]), _dtype(e[2])) != w)
        arg = args[[e[0] for e in first].index(name)]
        raise InputInfoError(f"input {name} is {tuple(arg.shape)} {arg.dtype}, compiled for {shape} {dtype}")

    def __call__(self, *args: torch.Tensor, out: torch.Tensor | list[torch.Tensor] | None = None,
                 **named: torch.Tensor) -> Any:
        if named:  # inputs by input_info name (optimum's XLM-R passes input_ids=, attention_mask=)
            names = [entry[0] for entry in self.model.input_info[0]]
            if unknown := sorted(set(named) - set(names[len(args):])):
                raise InputInfoError(f"inputs {unknown} are not in input_info {names} past {len(args)} positional")
            args = (*args, *(named.get(name) for name in names[len(args):]))
        index = self._bucket(args)
        graph = self.model.graphs[index]
        if index not in self.model.flops:
            self.model.flops[index] = contract.cost(graph, list(args))[0]
        contract.EXECUTED.append(self.model.flops[index])
        results = [t for t in torch.utils._pytree.tree_leaves(graph(*args)) if isinstance(t, torch.Tensor)]
        if out is not None:
            buffers = [out] if isinstance(out, torch.Tensor) else list(out)
            for buffer, result in zip(buffers, results, strict=True):
                buffer.copy_(result)
            results = buffers
        return results[0] if len(results) == 1 else results

    run = __call__


def compile(graphs: list[torch.fx.GraphModule], input_info: list, npu: str | None = None, num_devices: int = 1,
            dtype: str | None = None, compile_context: Any = None, **options: Any) -> RBLNCompiledModel:
    """The step after capture: the lowered graphs (one per bucket) into a compiled model for ``npu``."""
    if "tensor_parallel_size" in options:
        raise TypeError("compile: 'tensor_parallel_size' is retired; SDK 0.12 takes 'num_devices'")
    kept = {"num_devices": num_devices, "dtype": dtype, **options}
    return RBLNCompiledModel(graphs=graphs, input_info=input_info, npu=npu, options=kept)


def compile_from_torch(
    module: torch.nn.Module,
    input_info: list,
    npu: str | None = None,
    example_inputs: list | None = None,
    compile_context: Any = None,
    **kwargs: Any,
) -> RBLNCompiledModel:
    if "tensor_parallel_size" in kwargs:
        raise TypeError("compile_from_torch: 'tensor_parallel_size' is retired; SDK 0.12 takes 'num_devices'")
    options = {"npu": npu, "compile_context": compile_context, **kwargs}
    infos = buckets(input_info)
    if example_inputs is not None and len(infos) > 1:
        raise InputInfoError("example_inputs describe one input_info, not a list of buckets")
    graphs = []
    for info in infos:
        errors = input_info_errors(module, info, example_inputs)
        if errors:
            raise InputInfoError("; ".join(errors))
        inputs = example_inputs or [torch.zeros(shape, dtype=_dtype(dtype)) for _, shape, dtype in info]
        names = None if _named_inputs(module) is not None else [name for name, _, _ in info]
        lowered = contract.lower(module, inputs)
        found = contract.violations(module, lowered, inputs, names)
        contract.record("aot", module, inputs, options, lowered, found, [name for name, _, _ in info])
        graphs.append(lowered)
    return compile(graphs, infos, npu=npu, compile_context=compile_context, **kwargs)
