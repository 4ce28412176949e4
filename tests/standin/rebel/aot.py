"""Stand-in for rebel's ahead-of-time compile (the ATOM route; test-only): ``compile_from_torch`` checks
``input_info`` against the module's real inputs (names from its forward signature; shapes and dtypes from the
example inputs and from the shapes dynamo recorded on a captured graph), lowers the module to ATen and checks the
graph contract (``rebel.contract``); the compiled model saves to / loads from a ``.rbln`` file and its runtime
checks every call against ``input_info`` and runs the lowered graph on the CPU.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch

from rebel import contract

RUNTIMES: list[dict[str, Any]] = []  # every runtime created: device, visible devices, artifact
LOADED: list[str] = []  # every .rbln file loaded


class InputInfoError(TypeError):
    """``input_info`` does not describe the module's inputs."""


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _recorded_shapes(module: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes dynamo recorded on a captured graph's inputs (none for a plain module)."""
    graph = getattr(module, "graph", None)
    found = {}
    for node in graph.nodes if graph is not None else []:
        value = node.meta.get("example_value", node.meta.get("val")) if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor):
            found[str(node.target)] = (tuple(value.shape), value.dtype)
    return found


def input_info_errors(module: torch.nn.Module, input_info: list, example_inputs: list | None) -> list[str]:
    names = list(inspect.signature(module.forward).parameters)
    given = [entry[0] for entry in input_info]
    if given != names:
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


@dataclass
class RBLNCompiledModel:
    """A compiled module: built by ``compile_from_torch`` or loaded from a ``.rbln`` path."""

    graph: Any = None
    input_info: list | None = None
    npu: str | None = None

    def __init__(self, path: str | None = None, *, graph: Any = None, input_info: list | None = None, npu: str | None = None):
        if path is not None:
            # Real tensors even when called from inside a torch.compile backend: torch.load makes meta tensors while
            # dynamo's tracing context (and its fake mode) is active.
            with torch._guards.tracing(None):
                saved = torch.load(path, weights_only=False)
            graph, input_info, npu = saved["graph"], saved["input_info"], saved["npu"]
            LOADED.append(path)
        self.graph, self.input_info, self.npu = graph, input_info, npu

    def save(self, path: str) -> None:
        torch.save({"graph": self.graph, "input_info": self.input_info, "npu": self.npu}, path)

    def create_runtime(self, device: int = 0, tensor_type: str = "np", **_: Any) -> Runtime:
        return Runtime(self, device=device, tensor_type=tensor_type)


class Runtime:
    def __init__(self, model: RBLNCompiledModel, device: int = 0, tensor_type: str = "np", **_: Any):
        if tensor_type != "pt":
            raise TypeError(f"tensor_type={tensor_type!r}: the engine passes torch tensors ('pt')")
        self.model = model
        RUNTIMES.append(
            {"device": device, "visible": os.environ.get("RBLN_VISIBLE_DEVICES"), "legacy": os.environ.get("RBLN_DEVICES"), "npu": model.npu}
        )

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        if len(args) != len(self.model.input_info):
            raise InputInfoError(f"{len(args)} inputs for an input_info of {len(self.model.input_info)}")
        for arg, (name, shape, dtype) in zip(args, self.model.input_info):
            if (tuple(arg.shape), arg.dtype) != (tuple(shape), _dtype(dtype)):
                raise InputInfoError(f"input {name} is {tuple(arg.shape)} {arg.dtype}, compiled for {shape} {dtype}")
        out = self.model.graph(*args)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    run = __call__


def compile_from_torch(
    module: torch.nn.Module,
    input_info: list,
    npu: str | None = None,
    example_inputs: list | None = None,
    compile_context: Any = None,
    **kwargs: Any,
) -> RBLNCompiledModel:
    options = {"npu": npu, "compile_context": compile_context, **kwargs}
    if "tensor_parallel_size" in kwargs:
        raise TypeError("compile_from_torch: 'tensor_parallel_size' is retired; SDK 0.12 takes 'num_devices'")
    errors = input_info_errors(module, input_info, example_inputs)
    if errors:
        raise InputInfoError("; ".join(errors))
    inputs = example_inputs or [torch.zeros(shape, dtype=_dtype(dtype)) for _, shape, dtype in input_info]
    lowered = contract.lower(module, inputs)
    contract.record("aot", module, inputs, options, lowered, contract.violations(module, lowered, inputs))
    return RBLNCompiledModel(graph=lowered, input_info=[tuple(entry) for entry in input_info], npu=npu)
