"""The manifest next to a compile cache: what warmup compiled and, for an NPU, what the artifacts were built for.

A fleet compiles once (``rbln-retrieval compile MODEL --npu ...``) and ships the directory; a host with the same
model and options finds it under the same key. On the NPU the artifacts are only valid for the NPU, rebel-compiler
version and model snapshot they were built from (ATOM's compiled graphs carry the weights), so all three are part
of the directory's key: builds for several NPUs and SDK versions coexist in one cache root (a home directory shared
by a mixed ATOM/Rebel100 fleet), and a model whose weights changed in place keys a new directory and compiles. The
manifest pins them too, so a directory copied or renamed under another key is refused, never served.

The snapshot is the SHA-256 of every file's content; a file's hash is kept in a small JSON under the cache root,
keyed by its resolved path, size, mtime and ctime, so each weight file is read once, not at every start.

May import: the standard library, torch, ``rbln_retrieval.backend.npu.rbln_runtime``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

MANIFEST = "graphs.json"
# File hashes by (resolved path, size, mtime_ns, ctime_ns), under the cache root.
CONTENT_HASHES = "content-hashes.json"
PINNED = (("npu", "NPU"), ("sdk", "rebel-compiler"), ("snapshot", "model snapshot"))


class ArtifactMismatchError(RuntimeError):
    """The compile cache holds artifacts built for another NPU, SDK version or model snapshot."""


def snapshot_fingerprint(model_dir: str | Path, hashes: Path | None = None) -> str:
    """The model snapshot the artifacts hold: every file's relative name and the SHA-256 of its content (weights,
    configs, tokenizer). ``hashes``: the JSON that keeps each file's hash while its size, mtime and ctime stay the
    same (None: every file is read)."""
    root = Path(model_dir)
    known: dict[str, Any] = _read_hashes(hashes)
    digest = hashlib.sha256()
    changed = False
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts):
        real = path.resolve()  # a Hugging Face snapshot's files are links to its blobs
        stat = real.stat()
        stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]
        entry = known.get(str(real))
        if not (isinstance(entry, dict) and entry.get("stat") == stamp):
            with real.open("rb") as source:
                entry = {"stat": stamp, "sha256": hashlib.file_digest(source, "sha256").hexdigest()}
            known[str(real)] = entry
            changed = True
        digest.update(f"{path.relative_to(root)}:{entry['sha256']}\n".encode())
    if changed and hashes is not None:
        _write_hashes(hashes, known)
    return digest.hexdigest()[:16]


def _read_hashes(hashes: Path | None) -> dict[str, Any]:
    try:
        found = json.loads(hashes.read_text()) if hashes is not None and hashes.is_file() else {}
    except (OSError, ValueError):  # unreadable or torn: the hashes are computed again
        return {}
    return found if isinstance(found, dict) else {}


def _write_hashes(hashes: Path, known: dict[str, Any]) -> None:
    """Atomically, so a concurrent start reads the old or the new table, never half of one (a lost update costs
    one more read of the file it held)."""
    try:
        hashes.parent.mkdir(parents=True, exist_ok=True)
        tmp = hashes.with_name(f"{hashes.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        tmp.replace(hashes)
    except OSError:  # a read-only cache root: the hashes are computed at every start instead
        pass


def pins_for(config: Any) -> dict[str, str]:
    """What a ``BundledConfig``'s rbln build is valid for: the NPU (and family), rebel-compiler, the snapshot."""
    from rbln_retrieval.backend.npu import rbln_runtime

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
