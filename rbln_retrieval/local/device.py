"""Pick the device an engine runs on: the RBLN NPU when its runtime and a device are present, else the CPU.

Imports: backend (rbln_runtime).
"""

from __future__ import annotations

import logging
import os
from typing import Literal

from rbln_retrieval.backend.npu import rbln_runtime

logger = logging.getLogger(__name__)

Device = Literal["auto", "rbln", "cpu"]


def resolve_device(device: str, *, compile_only: bool = False) -> Literal["rbln", "cpu"]:
    """The device an engine runs on; ``compile_only`` builds an NPU's graphs on a host that may have no NPU."""
    if compile_only:
        if device != "rbln":
            raise ValueError(f"compile_only compiles for an RBLN NPU; it needs device='rbln', not {device!r}.")
        rbln_runtime.require_compiler()
        return "rbln"
    if device == "cpu":
        return "cpu"
    if device == "rbln":
        rbln_runtime.require()
        return "rbln"
    if device == "auto":
        found = rbln_runtime.probe()
        if found.usable:
            return "rbln"
        logger.info("Running on the CPU: %s.", found.reason)
        return "cpu"
    raise ValueError(f"device={device!r} is not one of 'auto', 'rbln', 'cpu'.")


def device_scope() -> tuple[str | None, ...]:
    """The NPUs this process may use, as its environment names them (SDK 0.12's variable and the legacy one Ray
    sets): processes given different NPUs run different engines."""
    return tuple(os.environ.get(name) for name in (rbln_runtime.VISIBLE_DEVICES_ENV, rbln_runtime.LEGACY_DEVICES_ENV))


def explain_auto() -> tuple[str, str]:
    """(device that 'auto' picks, why) for `rbln-retrieval doctor`."""
    found = rbln_runtime.probe()
    return ("rbln" if found.usable else "cpu"), found.reason
