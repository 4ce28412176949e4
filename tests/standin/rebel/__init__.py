"""A stand-in for rebel-compiler, for tests only (never shipped): it checks that every graph handed to the RBLN
compiler is one an NPU compiler can lower (``rebel.rules``: the SDK's rules with their sources, and this package's
stricter ones), then runs the lowered graph on the CPU and counts the FLOPs it executes.

It speaks the API SDK 0.12's own packages call on the encoder path, and the one rbln_retrieval.backend calls: the
ATOM route's ``compile_from_torch`` / ``compile`` / ``RBLNCompiledModel`` / ``Runtime`` (``rebel.aot``), the
Rebel100 route's ``rebel.core.torch_compile.rbln_backend`` and ``rebel.core.mega_cache``, ``CompileContext``, and the
device queries optimum-rbln and vllm-rbln make (``device_count``, ``npu_is_available``, ``get_npu_name``,
``manual_seed``). Nothing here claims NPU behaviour: numerics, memory and speed on an NPU are only verified on one.

The host it simulates: ``REBEL_STANDIN_NPU`` names the mounted NPU (default RBLN-CA25; empty: none, a build host),
``REBEL_STANDIN_DEVICES`` how many of it (default 1).
"""

from __future__ import annotations

import os

import torch

from rebel.aot import RBLNCompiledModel, Runtime, compile, compile_from_torch
from rebel.compile_context import CompileContext

__all__ = [
    "CompileContext",
    "RBLNCompiledModel",
    "Runtime",
    "compile",
    "compile_from_torch",
    "device_count",
    "get_npu_name",
    "manual_seed",
    "npu_is_available",
]

STANDIN = True
__version__ = "0.12.0"
MOUNTED_NPU_ENV = "REBEL_STANDIN_NPU"  # the NPU the stand-in pretends is mounted; empty: none (a build host)
DEVICES_ENV = "REBEL_STANDIN_DEVICES"


def device_count() -> int:
    return int(os.environ.get(DEVICES_ENV, "1")) if os.environ.get(MOUNTED_NPU_ENV, "RBLN-CA25") else 0


def npu_is_available(device_id: int = 0) -> bool:
    return 0 <= device_id < device_count()


def get_npu_name(device_id: int = 0) -> str | None:
    """The NPU's name, None for a device this host does not have (optimum-rbln checks devices that way)."""
    return os.environ.get(MOUNTED_NPU_ENV, "RBLN-CA25") if npu_is_available(device_id) else None


def manual_seed(seed: int) -> None:
    torch.manual_seed(seed)
