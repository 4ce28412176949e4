"""The single boundary to the RBLN runtime (rebel-compiler, torch-rbln): every call into them lives here."""

from __future__ import annotations

import glob
import importlib.util
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbln_retrieval.errors import DeviceUnavailableError

DEVICES_ENV = "RBLN_DEVICES"
TARGET_SOC_ENV = "RBLN_TARGET_SOC"
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
        return RuntimeProbe(
            False, devices, f"the RBLN runtime is not installed ({', '.join(pretty[m] for m in missing)} missing)"
        )
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


def require_compiler() -> None:
    """Compile-only needs rebel-compiler and nothing else: no torch-rbln, no NPU."""
    if importlib.util.find_spec("rebel") is None:
        raise DeviceUnavailableError(
            f"Compiling for an RBLN NPU needs rebel-compiler, which is not installed; {INSTALL_HINT}."
        )


def rbln_compile_backend(cache_dir: Path, *, compile_only: bool = False) -> CompileBackend:
    """rebel's torch.compile backend with the options vllm-rbln compiles with, caching graphs in ``cache_dir``.

    One compile context with weight sharing serves every bucket graph of the engine, so the NPU holds one copy
    of the weights; the NPU itself is whatever ``RBLN_DEVICES`` names for this process (rebel reads it; Ray's
    RBLN accelerator manager sets it per actor). ``compile_only`` compiles for the SoC named by
    ``RBLN_TARGET_SOC`` on a host without an NPU, to fill the cache another host reuses.
    """
    if compile_only:
        require_compiler()
    else:
        require()
    try:
        from rebel.core.torch_compile import rbln_backend
    except ImportError as exc:
        raise DeviceUnavailableError(
            f"device='rbln' cannot be used: rebel-compiler has no torch.compile backend ({exc}); {INSTALL_HINT}."
        ) from exc
    import torch

    allow_metrics_outside_dynamo_timed()
    options: dict[str, Any] = {
        "cache_dir": str(cache_dir / "rbln"),
        # strict: a graph the compiler cannot lower fails instead of falling back to the CPU.
        "mode": ["strict", "compile_only"] if compile_only else "strict",
        "tensor_parallel_size": 1,
        # Guards on tensor shapes and dtypes only, as upstream: every bucket graph is keyed by its shapes.
        "guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe,
        "_runtime_holder": [],
    }
    context = _compile_context()
    if context is not None:
        options["compile_context"] = context
    return CompileBackend(rbln_backend, options)


def _compile_context() -> Any:
    """rebel's compile context with weight sharing across the graphs compiled in it, where the installed rebel
    takes those parameters (as vllm-rbln checks them)."""
    try:
        from rebel.compile_context import CompileContext
    except ImportError:
        return None
    accepted = inspect.signature(CompileContext).parameters
    return CompileContext(**{name: True for name in ("use_weight_sharing", "use_global_ctx") if name in accepted})


def allow_metrics_outside_dynamo_timed() -> None:
    """torch >= 2.10 raises "No toplevel event active" when a backend compiles outside a ``dynamo_timed`` block,
    as graphs compiled during a warmup RPC are; vllm-rbln carries the same patch: the metric update is skipped,
    the compile is untouched."""
    from torch._dynamo.utils import CompileEventLogger as logger_cls

    for name in ("increment_toplevel", "add_to_set_toplevel"):
        original = getattr(logger_cls, name)
        if getattr(original, "_tolerant", False):
            continue

        def tolerant(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            try:
                return _original(*args, **kwargs)
            except RuntimeError as exc:
                if "No toplevel event active" in str(exc):
                    return None
                raise

        tolerant._tolerant = True  # type: ignore[attr-defined]
        setattr(logger_cls, name, staticmethod(tolerant))


def device_ids() -> list[str]:
    """The NPUs this process may use, from RBLN_DEVICES (empty: rebel's default device)."""
    return [d for d in os.environ.get(DEVICES_ENV, "").split(",") if d.strip()]


def npu_name(device_id: int = 0) -> str:
    """The NPU's SoC name (or, on a compile-only host, the one RBLN_TARGET_SOC names)."""
    import rebel

    name = rebel.get_npu_name(device_id)
    if not name:
        raise DeviceUnavailableError(
            f"The RBLN NPU {device_id} reports no name; on a host without an NPU set {TARGET_SOC_ENV} "
            "(e.g. RBLN-CA25) to compile for a named SoC."
        )
    return name
