"""A stand-in for rebel-compiler, for tests only (never shipped): it checks that every graph the bundled backend
hands the RBLN compiler is one an NPU compiler can lower, then runs the lowered graph on the CPU.

It implements the entry points rbln_retrieval.backend uses, with the signatures SDK 0.12 calls them with: the ATOM
route's ``rebel.compile_from_torch`` / ``RBLNCompiledModel`` / ``create_runtime`` (``rebel.aot``), the Rebel100
route's ``rebel.core.torch_compile.rbln_backend`` and ``rebel.core.mega_cache``, ``rebel.compile_context``, and
``rebel.get_npu_name``. Nothing here claims NPU behaviour: numerics, memory and speed on an NPU are only verified on
one.
"""

from __future__ import annotations

import os

from rebel.aot import RBLNCompiledModel, Runtime, compile_from_torch
from rebel.compile_context import CompileContext

__all__ = ["CompileContext", "RBLNCompiledModel", "Runtime", "compile_from_torch", "get_npu_name"]

STANDIN = True
__version__ = "0.12.0"
MOUNTED_NPU_ENV = "REBEL_STANDIN_NPU"  # the NPU the stand-in pretends is mounted; empty: none (a build host)


def get_npu_name(device_id: int = 0) -> str | None:
    return os.environ.get(MOUNTED_NPU_ENV, "RBLN-CA25") or None
