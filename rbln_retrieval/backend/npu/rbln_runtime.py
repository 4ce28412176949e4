"""The single boundary to the RBLN SDK (rebel-compiler, torch-rbln): every call into rebel lives here or in
``rbln_aot`` (the ATOM route, which only this module hands out). Which route compiles the bucket graphs is chosen by
the NPU's name, as SDK 0.12 chooses it: ATOM (``RBLN-CA*``) compiles ahead of time with ``rebel.compile_from_torch``
(vllm-rbln 0.12 refuses its torch.compile path there); Rebel100 (``RBLN-CR*``) compiles through torch.compile with
rebel's backend and the options vllm-rbln 0.12 passes.

May import: the standard library, torch, ``rbln_retrieval.errors``, ``rbln_retrieval.backend.npu.rbln_aot``; rebel only
inside functions (this module is imported on hosts without it).
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbln_retrieval.errors import DeviceUnavailableError

logger = logging.getLogger(__name__)

# SDK 0.12's names, and the legacy ones it still folds in (Ray's RBLN accelerator manager sets RBLN_DEVICES).
VISIBLE_DEVICES_ENV = "RBLN_VISIBLE_DEVICES"
FORCE_NPU_ENV = "RBLN_FORCE_NPU_NAME"
LEGACY_DEVICES_ENV = "RBLN_DEVICES"
LEGACY_NPU_ENV = "RBLN_TARGET_SOC"
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


def require_compiler() -> None:
    """Compile-only needs rebel-compiler and nothing else: no torch-rbln, no NPU."""
    if importlib.util.find_spec("rebel") is None:
        raise DeviceUnavailableError(
            f"Compiling for an RBLN NPU needs rebel-compiler, which is not installed; {INSTALL_HINT}."
        )


# -- environment -------------------------------------------------------------------------------------------------
_warned: set[str] = set()


def _deprecated(legacy: str, current: str, value: str) -> None:
    if legacy in _warned:
        return
    _warned.add(legacy)
    message = f"{legacy} is deprecated (SDK 0.12 reads {current}); this process uses {current}={value}."
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    logger.warning(message)


def visible_devices() -> list[str]:
    """The NPUs this process may use, from RBLN_VISIBLE_DEVICES (empty: every NPU, rebel's default).

    A legacy RBLN_DEVICES (which Ray's RBLN resource still sets per actor) is folded into RBLN_VISIBLE_DEVICES and
    unset, as vllm-rbln 0.12 does: rebel's runtime prefers the legacy name, so one left set would override the
    visible set this process narrows itself to.
    """
    legacy = os.environ.pop(LEGACY_DEVICES_ENV, None)
    if legacy is not None:
        _deprecated(LEGACY_DEVICES_ENV, VISIBLE_DEVICES_ENV, os.environ.setdefault(VISIBLE_DEVICES_ENV, legacy))
    return [d.strip() for d in os.environ.get(VISIBLE_DEVICES_ENV, "").split(",") if d.strip()]


def forced_npu_name() -> str | None:
    """The NPU named by RBLN_FORCE_NPU_NAME (the compile-only target), else by the legacy RBLN_TARGET_SOC."""
    if forced := os.environ.get(FORCE_NPU_ENV):
        return forced
    if legacy := os.environ.get(LEGACY_NPU_ENV):
        _deprecated(LEGACY_NPU_ENV, FORCE_NPU_ENV, legacy)
        return legacy
    return None


def npu_name() -> str:
    """The NPU the graphs are built for: the forced name when set, else the name the first visible NPU reports."""
    if forced := forced_npu_name():
        return forced
    import rebel

    name: str | None = rebel.get_npu_name(0)
    if not name:
        raise DeviceUnavailableError(
            f"The RBLN NPU reports no name; on a host without an NPU set {FORCE_NPU_ENV} (e.g. RBLN-CA25) to "
            "compile for a named NPU."
        )
    return name


@dataclass(frozen=True)
class NpuFamily:
    name: str  # Rebellions' product name
    prefix: str  # of the NPU names in the family
    route: str  # how its bucket graphs are compiled: "aot" (compile_from_torch) or "torch.compile"


FAMILIES = (NpuFamily("ATOM", "RBLN-CA", "aot"), NpuFamily("Rebel100", "RBLN-CR", "torch.compile"))


def family_of(npu: str) -> NpuFamily:
    for family in FAMILIES:
        if npu.upper().startswith(family.prefix):
            return family
    known = ", ".join(f"{f.prefix}* ({f.name})" for f in FAMILIES)
    raise DeviceUnavailableError(f"The RBLN NPU {npu!r} is of no family this package compiles for ({known}).")


def sdk_version() -> str:
    """rebel-compiler's version: artifacts are refused by any other."""
    import rebel

    return str(rebel.__version__)


# -- compile routes ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompileBackend:
    """What the bundled runner hands to torch.compile for one target."""

    backend: Any  # a torch.compile backend: a name such as "eager" or a callable
    options: dict[str, Any] | None
    fullgraph: bool = False


def host_compile_backend(name: str, cache_dir: Path) -> CompileBackend:
    if name == "inductor":
        # Inductor's FX-graph cache under the model's cache directory is what a restart reuses.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir / "inductor")
        return CompileBackend("inductor", None)
    if name in ("eager", "none"):  # "none" reaches here only under strict_shapes, which needs a trace to record
        return CompileBackend("eager", None)
    raise ValueError(f"host_compile_backend={name!r} is not 'eager' or 'inductor'.")


def contiguous_weights(module: Any) -> None:
    """Every parameter and buffer contiguous, in place, before a route compiles: the compiler would otherwise copy
    each strided weight while the original is alive (optimum-rbln's ``normalize_contiguous_``, vllm-rbln's load)."""
    for tensor in [*module.parameters(), *module.buffers()]:
        if not tensor.is_contiguous():
            tensor.data = tensor.data.contiguous()


def rbln_compile_backend(
    cache_dir: Path,
    *,
    npu: str,
    dtype: str,
    compile_only: bool,
    process_groups: dict[str, list[int]],
    snapshot: str = "",
) -> CompileBackend:
    """The route for ``npu``'s family; graphs and artifacts under ``cache_dir``, built from the model files whose
    content ``snapshot`` names."""
    if compile_only:
        require_compiler()
    else:
        require()
    if family_of(npu).route == "aot":
        from rbln_retrieval.backend.npu.rbln_aot import AotBackend

        # Dynamo only captures each bucket graph; the backend compiles it with compile_from_torch.
        aot = AotBackend(cache_dir / "rbln", npu=npu, compile_only=compile_only, snapshot=snapshot)
        return CompileBackend(aot, None, True)
    return _rebel100_backend(cache_dir, dtype=dtype, compile_only=compile_only, process_groups=process_groups)


def artifact_counts(backend: Any) -> dict[str, int]:
    """The ATOM route's .rbln files this start loaded and compiled (nothing for another backend)."""
    from rbln_retrieval.backend.npu.rbln_aot import AotBackend

    if not isinstance(backend, AotBackend):
        return {}
    return {"artifacts_loaded": backend.loaded, "artifacts_compiled": backend.compiled}


def _rebel100_backend(
    cache_dir: Path, *, dtype: str, compile_only: bool, process_groups: dict[str, list[int]]
) -> CompileBackend:
    """rebel's torch.compile backend with the options vllm-rbln 0.12's ``compile`` passes in its default
    device-tensor mode (no compile context there: weights are device tensors, one copy for every graph)."""
    try:
        from rebel.core.torch_compile import rbln_backend
    except ImportError as exc:
        raise DeviceUnavailableError(
            f"device='rbln' cannot be used: rebel-compiler has no torch.compile backend ({exc}); {INSTALL_HINT}."
        ) from exc
    import torch

    options: dict[str, Any] = {
        "num_devices": 1,
        "model_trace_method": "export",
        "process_group_dict": process_groups,
        # Guards on tensor shapes and dtypes only: every bucket graph is keyed by its shapes.
        "guard_filter_fn": torch.compiler.keep_tensor_guards_unsafe,
        "_runtime_holder": [],
        # strict: a graph the compiler cannot lower fails instead of falling back to the CPU.
        "mode": ["strict", "compile_only"] if compile_only else ["strict"],
        # The step's outputs are read back before the next step runs, so one output buffer serves every step.
        "use_static_output": True,
        "dtype": dtype,
        "cache_dir": str(cache_dir / "rbln"),
        "mega_cache_only": True,
    }
    return CompileBackend(rbln_backend, options, True)


def _bundle(cache_dir: Path) -> Path:
    return cache_dir / "rbln" / "mega_cache.bin"


def load_compile_bundle(cache_dir: Path) -> bool:
    """Rebel100: rebel's mega-cache bundle read before warmup, so the warmup's compiles hit it; whether one was
    read."""
    from rebel.core import mega_cache

    mega_cache.set_dir(str(cache_dir / "rbln"))
    path = _bundle(cache_dir)
    if not path.is_file():
        return False
    with path.open("rb") as source:
        return mega_cache.read_bundle(source) is not None


def save_compile_bundle(cache_dir: Path) -> None:
    """Rebel100: the warmup's compiles written as one bundle, atomically, for the next start (or another host)."""
    from rebel.core import mega_cache

    mega_cache.set_dir(str(cache_dir / "rbln"))
    path = _bundle(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as target:
        written = mega_cache.write_bundle(target)
    if written:
        tmp.replace(path)
    else:
        tmp.unlink()
