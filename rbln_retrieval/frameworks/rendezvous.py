"""Where the processes of one user meet the holder of a shared engine: the run folder, one engine's files (named
by a digest of its key, rbln_retrieval.engines.shared.EngineSpec.key) and the locks on them.

Every coordination is an ``flock`` on a file, never a pid: the kernel releases a lock when its process dies however
it dies (SIGKILL included), and a pid may be reused. One engine's files, in the run folder (mode 0700, so no other
user reaches the socket):

- ``K.sock``: the holder's Unix socket (in ``$TMPDIR/rbln-retrieval-UID`` instead, mode 0700, where the run
  folder's path is too long for a socket's address);
- ``K.json``: who holds the engine (pid, command, model, socket) and whether it answers yet (mode 0600);
- ``K.holder``: locked exclusively by the holder for its whole life: the holder is alive while it is locked;
- ``K.start``: locked exclusively by the one process starting a holder; the others wait on it, then attach;
- ``K.lease``: locked shared by every attached process; the holder exits once it can lock it exclusively (no
  client left), and keeps it locked until it has exited, so a newcomer waits for it to be gone, then starts anew;
- ``K.error``: the exception the holder's engine start raised (pickled), raised again by the starting client;
- ``K.log``: the holder's stderr.

Imports: nothing of the package; fcntl, json.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# "1" shares every framework object's local engine across processes, "0" never; unset: only on an RBLN NPU.
SHARE_ENV = "RBLN_SHARE_ENGINES"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# The longest Unix socket path every platform binds (sun_path is 108 bytes on Linux, 104 on macOS, with its NUL).
MAX_SOCKET_PATH = 103


def share_setting() -> bool | None:
    """SHARE_ENV read as a boolean, or None when it is unset (the device decides)."""
    value = os.environ.get(SHARE_ENV, "").strip().lower()
    if not value:
        return None
    if value in _TRUE + _FALSE:
        return value in _TRUE
    raise ValueError(f"{SHARE_ENV}={value!r} is not one of {', '.join(_TRUE + _FALSE)}.")


def run_dir() -> Path:
    """This user's run folder: ``$XDG_RUNTIME_DIR/rbln-retrieval``, else ``~/.cache/rbln-retrieval/run``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    root = Path(runtime) / "rbln-retrieval" if runtime else Path.home() / ".cache" / "rbln-retrieval" / "run"
    return _private_dir(root)


def _private_dir(root: Path) -> Path:
    """``root`` created if needed, a folder of this user's only (mode 0700), or a sentence saying why it cannot be."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{root} is not a folder of this user's (a symlink, or owned by uid {info.st_uid}); remove it, or set "
            f"XDG_RUNTIME_DIR to a folder of your own."
        )
    os.chmod(root, 0o700)  # mkdir's mode passes through the umask, and the folder may predate this process
    return root


def _short_socket_dir() -> Path:
    """Where a socket goes when the run folder's path is too long for one: a folder of this user's in the temporary
    folder, named by the uid, so every process of the user finds the same one."""
    return _private_dir(Path(tempfile.gettempdir()) / f"rbln-retrieval-{os.getuid()}")


@dataclass(frozen=True)
class EngineFiles:
    """The files of one shared engine: ``stem`` plus a suffix each (see the module's docstring)."""

    stem: Path

    @classmethod
    def for_key(cls, key: tuple[Any, ...]) -> EngineFiles:
        # A digest keeps the names short; a run folder too deep for a socket's address moves only the socket.
        return cls(run_dir() / hashlib.sha256(repr(key).encode()).hexdigest()[:24])

    def path(self, suffix: str) -> Path:
        return self.stem.with_suffix("." + suffix)

    @property
    def socket(self) -> Path:
        path = self.path("sock")
        if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
            return path
        return _short_socket_dir() / path.name  # a deep $HOME or $XDG_RUNTIME_DIR: the digest alone is short

    def read_info(self) -> dict[str, Any] | None:
        """The holder's record (K.json), or None when there is none (or it is being replaced)."""
        try:
            info: dict[str, Any] = json.loads(self.path("json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return info

    def write_info(self, info: dict[str, Any]) -> None:
        """K.json, replaced whole (a reader never sees half of it), readable by this user only."""
        partial = self.path(f"json.{os.getpid()}")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(info, out)
        os.replace(partial, self.path("json"))

    def holder_alive(self) -> bool:
        """Whether a holder process holds K.holder (it does from before its engine starts until it has exited)."""
        fd = try_lock(self.path("holder"), fcntl.LOCK_EX)
        if fd is None:
            return True
        os.close(fd)
        return False


def lock(path: Path, operation: int) -> int:
    """A file descriptor of ``path`` holding ``operation`` (fcntl.LOCK_SH or LOCK_EX), waiting for it; closing the
    descriptor releases the lock."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, operation)
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_lock(path: Path, operation: int) -> int | None:
    """lock() without waiting: None when another process holds a conflicting lock."""
    try:
        return lock(path, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return None


@contextlib.contextmanager
def locked(path: Path, operation: int) -> Iterator[int]:
    fd = lock(path, operation)
    try:
        yield fd
    finally:
        os.close(fd)
