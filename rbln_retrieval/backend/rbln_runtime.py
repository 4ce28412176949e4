"""The single boundary to the RBLN runtime (rebel-compiler, torch-rbln): every call into them lives here."""

from __future__ import annotations

import glob
import importlib.util
from dataclasses import dataclass

from rbln_retrieval.errors import DeviceUnavailableError

INSTALL_HINT = (
    "install rebel-compiler and torch-rbln from Rebellions' package index (see the README's RBLN section), "
    "or use device='cpu'"
)


@dataclass(frozen=True)
class RuntimeProbe:
    installed: bool
    devices: int
    reason: str  # why the NPU can or cannot be used, one sentence

    @property
    def usable(self) -> bool:
        return self.installed and self.devices > 0


def probe() -> RuntimeProbe:
    """Look for the runtime packages and NPU device nodes without importing anything heavy."""
    missing = [name for name in ("rebel", "torch_rbln") if importlib.util.find_spec(name) is None]
    devices = len(glob.glob("/dev/rbln[0-9]*"))
    if missing:
        pretty = {"rebel": "rebel-compiler", "torch_rbln": "torch-rbln"}
        return RuntimeProbe(False, devices, f"the RBLN runtime is not installed ({', '.join(pretty[m] for m in missing)} missing)")
    if devices == 0:
        return RuntimeProbe(True, 0, "the RBLN runtime is installed but no NPU device (/dev/rbln*) is present")
    return RuntimeProbe(True, devices, f"the RBLN runtime is installed and {devices} NPU device(s) are present")


def require() -> RuntimeProbe:
    found = probe()
    if not found.usable:
        raise DeviceUnavailableError(f"device='rbln' cannot be used: {found.reason}; {INSTALL_HINT}.")
    return found
