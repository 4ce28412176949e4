"""The manifest next to a compile cache: what warmup compiled and, for an NPU, what the artifacts were built for.

A fleet compiles once (``rbln-retrieval compile MODEL --npu ...``) and ships the directory; a host with the same
model and options finds it under the same key. On the NPU the artifacts are only valid for the NPU, rebel-compiler
version and model snapshot they were built from (ATOM's compiled graphs carry the weights), so all three are part
of the directory's key: builds for several NPUs and SDK versions coexist in one cache root (a home directory shared
by a mixed ATOM/Rebel100 fleet), and a model whose weights changed in place keys a new directory and compiles. The
manifest pins them too, so a directory copied or renamed under another key is refused, never served.

The snapshot is the SHA-256 of every file's content; a file's hash is kept in a small JSON under the cache root,
keyed by its resolved path, size, mtime and ctime, so each weight file is read once, not at every start.

Several processes share a cache (replicas of one model on identical NPUs start together) and any may crash: every
file is written under a unique temporary name and renamed over its target, so a reader sees the old or the new file,
never half of one; a manifest or hash table that is unreadable anyway (a crash of an older version, a full disk) is
a miss, rebuilt with one warning; and the process that compiles a key holds its lock (``compile_lock``) from its
first look at the cache to the manifest's write, so a second process waits and loads what the first built instead
of compiling and writing the same files. Artifacts are code this process loads (rebel's graphs, pickled Inductor
entries): a cache root another user can write is refused (``check_owner``).

May import: the standard library, torch, ``rbln_retrieval.backend.npu.rbln_runtime``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger(__name__)

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
    found = _read_json(hashes) if hashes is not None else None
    return found if found is not None else {}  # unreadable or torn: the hashes are computed again


def _write_hashes(hashes: Path, known: dict[str, Any]) -> None:
    """Atomically, so a concurrent start reads the old or the new table, never half of one (a lost update costs
    one more read of the file it held)."""
    try:
        hashes.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(hashes, json.dumps(known).encode())
    except OSError:  # a read-only cache root: the hashes are computed at every start instead
        pass


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file of a name no other process or thread uses, renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as target:
            target.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None if there is none, and (with a warning, the file removed so the next
    reader does not warn again) if it is unreadable: a miss, rebuilt by whoever reads it."""
    try:
        found = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        found = exc
    if isinstance(found, dict):
        return found
    logger.warning("The compile cache's %s is unreadable (%s); it is rebuilt.", path, _why(found))
    path.unlink(missing_ok=True)
    return None


def _why(found: object) -> str:
    return f"{type(found).__name__}: {found}" if isinstance(found, Exception) else f"a JSON {type(found).__name__}"


def compile_lock(cache_dir: Path) -> IO[bytes] | None:
    """Hold the lock of ``cache_dir``'s key until the returned file is closed (or the process ends): the holder
    alone compiles the key and writes its files. A file beside the directory, which a rebuild may remove. None when
    this process holds it already (an in-process engine whose start failed before its manifest was written): waiting
    on itself would never end, and its files are written whole anyway."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    path = cache_dir.with_name(f"{cache_dir.name}.lock")
    held = _held.get(path)
    if held is not None and not held.closed:
        return None
    lock = path.open("ab")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
    except BaseException:
        lock.close()
        raise
    _held[path] = lock
    return lock


# The compile locks this process holds, by path (flock conflicts between two opens in one process too).
_held: dict[Path, IO[bytes]] = {}


def check_owner(root: Path) -> None:
    """Refuse, in one sentence, a cache root (or its key directories) that another user owns, or that other users
    may write without the sticky bit: its artifacts would be code they chose."""
    for path in (root, *(root.iterdir() if root.is_dir() else ())):
        try:
            found = path.stat()
        except FileNotFoundError:  # removed meanwhile by a rebuild
            continue
        if not stat.S_ISDIR(found.st_mode):
            continue
        if found.st_uid != os.geteuid():
            reason = f"it belongs to user id {found.st_uid}, not to this process's {os.geteuid()}"
        elif found.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not found.st_mode & stat.S_ISVTX:
            reason = f"its mode {stat.filemode(found.st_mode)} lets other users write it"
        else:
            continue
        raise ArtifactMismatchError(
            f"The compile cache at {path} is refused because {reason}, and its artifacts are code this process would "
            f"load: set RBLN_RETRIEVAL_CACHE_DIR to a directory only you can write (or run `chmod go-w {path}`)."
        )


def pins_for(config: Any) -> dict[str, str]:
    """What a ``BundledConfig``'s rbln build is valid for: the NPU (and family), rebel-compiler, the snapshot."""
    from rbln_retrieval.backend.npu import rbln_runtime

    family = rbln_runtime.family_of(config.npu)
    return {"npu": config.npu, "family": family.name, "sdk": rbln_runtime.sdk_version(), "snapshot": config.snapshot}


def read(cache_dir: Path) -> dict[str, Any] | None:
    """The manifest of ``cache_dir``; None when there is none or it is unreadable (then with one warning)."""
    return _read_json(cache_dir / MANIFEST)


def check(cache_dir: Path, pins: dict[str, str], *, model: str, rebuild: bool) -> bool:
    """Whether ``cache_dir`` holds a warmed build for ``pins``. A build for other pins is refused in one sentence,
    or, when ``rebuild`` (the compile command), removed so the new build replaces it; so is a cache root other users
    may write (check_owner)."""
    check_owner(cache_dir.parent)
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
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(cache_dir / MANIFEST, json.dumps(manifest, indent=1).encode())
