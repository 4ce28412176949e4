"""The single boundary to the RBLN runtime (rebel-compiler, torch-rbln): every call into them lives here."""

from __future__ import annotations

import glob
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class CompileBackend:
    """What the bundled runner hands to torch.compile for one target."""

    backend: Any  # a torch.compile backend: a name such as "eager" or a callable
    options: dict[str, Any] | None


def host_compile_backend(name: str, cache_dir: Path) -> CompileBackend:
    if name == "inductor":
        # Inductor's FX-graph cache under the model's cache directory is what a restart reuses.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
        return CompileBackend("inductor", None)
    if name in ("eager", "none"):  # "none" reaches here only under strict_shapes, which needs a trace to record
        return CompileBackend("eager", None)
    raise ValueError(f"host_compile_backend={name!r} is not 'eager' or 'inductor'.")


def rbln_compile_backend(cache_dir: Path, device_id: int = 0) -> CompileBackend:
    """rebel's torch.compile backend for the NPU ``device_id``, caching compiled graphs in ``cache_dir``."""
    require()
    try:
        from rebel.core.torch_compile import rbln_backend
    except ImportError as exc:
        raise DeviceUnavailableError(
            f"device='rbln' cannot be used: rebel-compiler has no torch.compile backend ({exc}); {INSTALL_HINT}."
        ) from exc
    # The same option names vllm-rbln passes: one device per engine, strict mode (no silent CPU fallback).
    options = {
        "cache_dir": str(cache_dir / "rbln"),
        "mode": "strict",
        "tensor_parallel_size": 1,
        "global_device_id": device_id,
    }
    return CompileBackend(rbln_backend, options)


def npu_name(device_id: int = 0) -> str:
    """The NPU's SoC name, e.g. for logs; raises the clear error when the runtime is absent."""
    require()
    import rebel

    name = rebel.get_npu_name(device_id)
    if not name:
        raise DeviceUnavailableError(f"device='rbln' cannot be used: NPU {device_id} reports no name; {INSTALL_HINT}.")
    return name
