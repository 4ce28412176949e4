"""A stand-in for rebel-compiler, for tests only (never shipped): it checks that every graph the bundled
backend hands the RBLN compiler is one an NPU compiler can lower, then runs the lowered graph on the CPU.

It implements the entry points rbln_retrieval.backend.rbln_runtime uses, with the signatures vllm-rbln calls:
``rebel.core.torch_compile.rbln_backend``, ``rebel.compile_context.CompileContext``, ``rebel.get_npu_name``.
Nothing here claims NPU behaviour: numerics, memory and speed on an NPU are only verified on one.
"""

from __future__ import annotations

import os

STANDIN = True
DEFAULT_SOC = "RBLN-CA25"


def get_npu_name(device_id: int = 0) -> str | None:
    """The SoC a compile targets: RBLN_TARGET_SOC when set (rebel's compile-only fallback), else an NPU's name."""
    return os.environ.get("RBLN_TARGET_SOC") or DEFAULT_SOC
