"""The rules the stand-in compiler enforces (test-only), each with where it comes from.

Two sets: the SDK's rules, each read from Rebellions' own code or docs (the source is cited), which every graph
must keep, and this package's own stricter rules, which rbln-retrieval's bucket graphs keep on top as a
conservative choice (the SDK's code does otherwise, or no source was found). Graphs from Rebellions' own packages
(optimum-rbln, vllm-rbln) are judged by the SDK's rules only; rbln-retrieval's graphs by both.

Which set is active: ``REBEL_STANDIN_RULES`` (``package``, the default: both sets; ``sdk``: the SDK's only), or
``rules_for(...)`` around one compile.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

RULES_ENV = "REBEL_STANDIN_RULES"
SDK, PACKAGE = "sdk", "package"


@dataclass(frozen=True)
class Rule:
    name: str
    scope: str  # SDK: Rebellions' rule; PACKAGE: this package's own stricter choice
    check: str  # what the stand-in refuses
    source: str  # where the rule comes from (file:line in the SDK 0.12 wheels, or why it is ours)


RULES = (
    Rule("aten-only", SDK, "an op outside aten, prims and rbln_custom_ops",
         "Rebellions' docs, 'Supported OPs - PyTorch' (v0.12.0) list torch/ATen ops only; vllm-rbln's platform "
         "loads no vLLM _C kernels (vllm_rbln/platform/__init__.py:107, import_kernels does nothing)"),
    Rule("static-shapes", SDK, "a symbolic shape anywhere in the graph",
         "compile_from_torch takes static (name, shape, dtype) input_info (optimum/rbln/modeling_base.py:531); "
         "vllm-rbln compiles with dynamic=False (vllm_rbln/v1/sample/rbln_sampler.py:108)"),
    Rule("input-info", SDK, "input_info that does not describe the module's inputs, or a call with other shapes",
         "optimum/rbln/transformers/modeling_generic.py:167 (one input_info per bucket, matched by position; the "
         "runtime dispatches by input shape, modeling_generic.py:185)"),
    Rule("num-devices", SDK, "tensor_parallel_size instead of num_devices",
         "optimum/rbln/utils/runtime_utils.py:34 (the compiler's signature names num_devices)"),
    Rule("sdk-dtypes", SDK, "a dtype other than float32, bfloat16, float16, int32, int64, bool",
         "optimum-rbln compiles encoders with int64 inputs (modeling_generic.py:60, rbln_dtype='int64'); the "
         "compiler converts integer inputs itself (vllm_rbln/v1/attention/backends/flash_attention.py:168)"),
    Rule("no-int64", PACKAGE, "any int64 tensor (input or intermediate)",
         "ours: int64 is not device-native (the compiler computes it as int32 and places integer gathers on the "
         "host, flash_attention.py:168), so our graphs carry int32 indices and never depend on that conversion"),
    Rule("no-input-writes", PACKAGE, "a write into a graph input",
         "ours: an input mutation inside a static graph is state the runtime would have to copy back; no SDK "
         "source found, optimum's wrappers never write inputs"),
    Rule("weights-as-state", PACKAGE, "a weight passed as a graph input, or an empty weight",
         "ours: one weight-sharing CompileContext needs the weights as module state (rebel.compile_context); "
         "vLLM's CPU repacking leaves empty parameters"),
    Rule("contiguous-weights", PACKAGE, "a non-contiguous weight",
         "ours, stricter than the SDK: the compiler copies such weights itself at a memory cost "
         "(optimum/rbln/modeling_base.py:57, normalize_contiguous_)"),
    Rule("align-64", PACKAGE, "an input whose last dimension is not a multiple of 64",
         "ours: token slots padded to 64 so the device's tiles are full; no check in the SDK's code (optimum pads "
         "to max_seq_len, whatever it is)"),
    Rule("no-bool-inversion", PACKAGE, "~ on a bool mask",
         "ours: no documented limit; optimum-rbln's own graphs avoid it (grounding_dino_architecture.py:354, "
         "'RBLN FIX, change from ~ to 1.0 -')"),
    Rule("no-0d-reduction", PACKAGE, "a reduction to a 0-d tensor",
         "ours: a conservative choice for a static-shape compiler; no source in the 0.12 wheels"),
    Rule("no-zero-size", PACKAGE, "a zero-size tensor",
         "ours: a conservative choice for a static-shape compiler; no source in the 0.12 wheels"),
)
BY_NAME = {rule.name: rule for rule in RULES}
_override: list[str] = []


def active_scope() -> str:
    scope = _override[-1] if _override else os.environ.get(RULES_ENV, PACKAGE) or PACKAGE
    if scope not in (SDK, PACKAGE):
        raise ValueError(f"{RULES_ENV}={scope!r} is not {SDK!r} or {PACKAGE!r}")
    return scope


def enforced(name: str) -> bool:
    """Whether the rule ``name`` applies under the active scope: SDK rules always, ours under 'package'."""
    return BY_NAME[name].scope == SDK or active_scope() == PACKAGE


@contextlib.contextmanager
def rules_for(scope: str) -> Iterator[None]:
    """The rules of ``scope`` for the compiles inside the block (per compile, in this process)."""
    _override.append(scope)
    try:
        active_scope()
        yield
    finally:
        _override.pop()


def table() -> str:
    """The rules as a Markdown table (docs/rbln.md carries it; a test keeps the two equal)."""
    rows = ["| rule | whose | refuses | source |", "| --- | --- | --- | --- |"]
    rows += [f"| `{r.name}` | {'SDK' if r.scope == SDK else 'ours'} | {r.check} | {r.source} |" for r in RULES]
    return "\n".join(rows)
