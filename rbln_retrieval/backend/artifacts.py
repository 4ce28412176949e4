"""The manifest next to a compile cache: what warmup compiled and, for an NPU, what the artifacts were built for.

A fleet compiles once (``rbln-retrieval compile MODEL --npu ...``) and ships the directory; a host with the same
model and options finds it under the same key. On the NPU the artifacts are only valid for the NPU, rebel-compiler
version and model snapshot they were built from, so those are pinned here and a start with any other is refused
(the directory's key leaves them out on purpose: a mismatch must be found, not silently compiled beside).

May import: the standard library, torch, ``rbln_retrieval.backend.rbln_runtime``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

MANIFEST = "graphs.json"
PINNED = (("npu", "NPU"), ("sdk", "rebel-compiler"), ("snapshot", "model snapshot"))


class ArtifactMismatchError(RuntimeError):
    """The compile cache holds artifacts built for another NPU, SDK version or model snapshot."""


def snapshot_fingerprint(model_dir: str | Path) -> str:
    """The model snapshot the artifacts hold (ATOM's compiled graphs carry the weights): every file's name and size,
    and the bytes of its small JSON files (configs, tokenizer settings)."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts):
        digest.update(f"{path.relative_to(root)}:{path.stat().st_size}\n".encode())
        if path.suffix == ".json" and path.stat().st_size < 1 << 20:
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def pins_for(config: Any) -> dict[str, str]:
    """What a ``BundledConfig``'s rbln build is valid for: the NPU (and family), rebel-compiler, the snapshot."""
    from rbln_retrieval.backend import rbln_runtime

    family = rbln_runtime.family_of(config.npu)
    return {"npu": config.npu, "family": family.name, "sdk": rbln_runtime.sdk_version(), "snapshot": config.snapshot}


def read(cache_dir: Path) -> dict[str, Any] | None:
    path = cache_dir / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def check(cache_dir: Path, pins: dict[str, str], *, model: str, rebuild: bool) -> bool:
    """Whether ``cache_dir`` holds a warmed build for ``pins``. A build for other pins is refused in one sentence,
    or, when ``rebuild`` (the compile command), removed so the new build replaces it."""
    found = read(cache_dir)
    if found is None:
        return False
    built = found.get("pins", {})
    for key, label in PINNED:
        if built.get(key) == pins[key]:
            continue
        if rebuild:
            shutil.rmtree(cache_dir)
            return False
        raise ArtifactMismatchError(
            f"The RBLN artifacts in {cache_dir} were built for {label} {_shown(built, key)} but this host has "
            f"{label} {_shown(pins, key)}: rebuild them with `rbln-retrieval compile {model} --npu {pins['npu']}` "
            "or remove the directory."
        )
    return True


def _shown(pins: dict[str, str], key: str) -> str:
    return f"{pins.get(key)} ({pins.get('family')})" if key == "npu" else str(pins.get(key))


def write(cache_dir: Path, buckets: list[int | str], graphs: list[Any], pins: dict[str, str] | None) -> None:
    """Record what warmup compiled (``compile.CompiledGraph``s) and, on an NPU, its pins, next to the backend's
    artifacts (rebel's .rbln files or bundle, inductor's FX cache); the host's "eager" backend keeps none."""
    import torch

    described = [{"bucket": g.bucket, "input_shapes": g.input_shapes, "ops": g.ops} for g in graphs]
    manifest = {"buckets": buckets, "torch": torch.__version__, "pins": pins or {}, "graphs": described}
    tmp = cache_dir / f"{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(cache_dir / MANIFEST)
