"""Stand-in for rebel's torch.compile backend (the Rebel100 route; test-only): checks that torch.compile is called
the way vllm-rbln 0.12 calls it (``fullgraph=True``; options ``num_devices``, ``process_group_dict``,
``use_static_output``, ``dtype``, ``mode`` as a list, ``model_trace_method="export"``; never the old
``tensor_parallel_size``), lowers each graph to ATen and checks the graph contract (``rebel.contract``), records it,
and runs the lowered graph on the CPU (counting its FLOPs per call). With ``cache_dir`` and ``mega_cache_only`` a graph already in the mega cache
(``rebel.core.mega_cache``) is taken from it instead of lowered again.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from rebel import contract
from rebel.core import mega_cache

REQUIRED_OPTIONS = ("num_devices", "process_group_dict", "use_static_output", "dtype", "mode", "model_trace_method")
RETIRED_OPTIONS = {"tensor_parallel_size": "num_devices"}

COMPILED = contract.COMPILED
GraphContractError = contract.GraphContractError


class CompileOptionError(TypeError):
    """torch.compile was called with options (or flags) SDK 0.12's backend does not take."""


def _fullgraph() -> bool:
    """Whether the torch.compile call that handed us this graph asked for fullgraph=True."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    return bool(InstructionTranslator.current_tx().one_graph)


def option_errors(options: dict[str, Any]) -> list[str]:
    found = [f"option {old!r} is retired; SDK 0.12 takes {new!r}" for old, new in RETIRED_OPTIONS.items() if old in options]
    found += [f"option {name!r} missing" for name in REQUIRED_OPTIONS if name not in options]
    if "mode" in options and not isinstance(options["mode"], list):
        found.append(f"mode must be a list, not {options['mode']!r}")
    if options.get("model_trace_method", "export") != "export":
        found.append(f"model_trace_method {options['model_trace_method']!r} is not 'export'")
    if "compile_context" in options:
        found.append("compile_context is not used in device-tensor (export) mode")
    if not _fullgraph():
        found.append("torch.compile was called without fullgraph=True")
    return found


def _key(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any]) -> str:
    shapes = [(tuple(t.shape), str(t.dtype)) for t in example_inputs if isinstance(t, torch.Tensor)]
    # The weights' values too: models of one architecture and size trace to the same code.
    weights = [(n, float(t.double().sum())) for n, t in [*gm.named_parameters(), *gm.named_buffers()]]
    return hashlib.sha256(f"{gm.code}\n{shapes}\n{weights}\n{options.get('dtype')}".encode()).hexdigest()


def rbln_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], options: dict[str, Any] | None = None):
    options = dict(options or {})
    errors = option_errors(options)
    if errors:
        raise CompileOptionError("; ".join(errors))
    cached = options.get("cache_dir") and options.get("mega_cache_only")
    key = _key(gm, example_inputs, options)
    if cached and key in mega_cache.STORE:
        contract.record("torch.compile", gm, example_inputs, options, None, [])
        lowered = mega_cache.STORE[key]
        return _counted(lowered, contract.cost(lowered, example_inputs)[0])
    lowered = contract.lower(gm, example_inputs)
    found = contract.violations(gm, lowered, example_inputs)
    compiled = contract.record("torch.compile", gm, example_inputs, options, lowered, found)
    if cached:
        mega_cache.STORE[key] = lowered
    return _counted(lowered, compiled.flops)


def _counted(lowered: torch.fx.GraphModule, flops: float):
    """``lowered``, run on the CPU, each call's FLOPs appended to ``contract.EXECUTED``."""

    def run(*args: Any) -> Any:
        contract.EXECUTED.append(flops)
        return lowered(*args)

    return run
