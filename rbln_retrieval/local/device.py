"""Pick the device an engine runs on: the RBLN NPU when its runtime and a device are present, else the CPU.

Imports: backend (its front door: the RBLN runtime's facts), engines (options).
"""

from __future__ import annotations

import logging
import os
from typing import Literal, get_args

from rbln_retrieval import backend
from rbln_retrieval.engines.options import Device

logger = logging.getLogger(__name__)


def resolve_device(device: str, *, compile_only: bool = False) -> Literal["rbln", "cpu"]:
    """The device an engine runs on; ``compile_only`` builds an NPU's graphs on a host that may have no NPU."""
    if compile_only:
        if device != "rbln":
            raise ValueError(f"compile_only compiles for an RBLN NPU; it needs device='rbln', not {device!r}.")
        backend.require_compiler()
        return "rbln"
    if device == "cpu":
        return "cpu"
    if device == "rbln":
        backend.require()
        return "rbln"
    if device == "auto":
        found = backend.probe()
        if found.usable:
            return "rbln"
        logger.info("Running on the CPU: %s.", found.reason)
        return "cpu"
    raise ValueError(f"device={device!r} is not one of {', '.join(map(repr, get_args(Device)))}.")


def device_scope() -> tuple[str | None, ...]:
    """The NPUs this process may use, as its environment names them (SDK 0.12's variable and the legacy one Ray
    sets): processes given different NPUs run different engines."""
    return tuple(os.environ.get(name) for name in (backend.VISIBLE_DEVICES_ENV, backend.LEGACY_DEVICES_ENV))


def explain_auto() -> tuple[str, str]:
    """(device that 'auto' picks, why) for `rbln-retrieval doctor`."""
    found = backend.probe()
    return ("rbln" if found.usable else "cpu"), found.reason
