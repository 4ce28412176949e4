"""The holder of a shared engine: a process that runs one PoolingEngine and answers the calls of every process of
this user attached to it (attach.py) on a Unix socket, until the last of them is gone.

A client's call arrives as it was made (the method's name, its arguments and options) and runs on the same
PoolingEngine a process would have started for itself, so its result is that process's in-process result: the
same rows, scores, rankings and errors. The wire is multiprocessing's connection (pickled messages), on a socket in
a folder only its owner can enter (rendezvous.run_dir, mode 0700): only that user's processes, which could run
any code of theirs anyway, send it pickles.

Started by attach.py as ``python -m rbln_retrieval.frameworks.holder STEM`` in a session of its own (it outlives
the process that started it, and a Ctrl-C in that process's terminal does not reach it), with the engine's spec
pickled on its stdin. Its lifetime is rendezvous.py's leases.

Imports: frameworks (rendezvous), engines (shared) for the spec it is handed; the engine class the spec names.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import sys
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from rbln_retrieval.engines.shared import EngineSpec
from rbln_retrieval.frameworks.rendezvous import EngineFiles, try_lock

PING = "__ping__"
GETATTR = "__getattr__"
CALLABLE = "__callable__"  # what GETATTR answers for a method: the client then calls it by name
LEASE_POLL_SECONDS = 1.0  # how often the holder looks for a moment with no client attached


def serve(files: EngineFiles, spec: EngineSpec) -> int:
    """Hold the engine of ``spec`` on ``files.socket`` until no client holds a lease; returns the exit code."""
    holder = try_lock(files.path("holder"), fcntl.LOCK_EX)
    if holder is None:  # another holder of this engine is alive: the client attaches to that one
        return 0
    files.path("error").unlink(missing_ok=True)
    files.write_info(
        {
            "pid": os.getpid(),
            "command": " ".join(sys.orig_argv),
            "model": str(spec.model),
            "socket": str(files.socket),
            "ready": False,
        }
    )
    try:
        engine = spec.start()
    except Exception as error:  # the starting client raises it again, as its own start would have
        _record_error(files, error)
        files.path("json").unlink(missing_ok=True)
        return 1
    files.socket.unlink(missing_ok=True)  # a dead holder's socket
    listener = Listener(str(files.socket), "AF_UNIX")
    files.write_info({**(files.read_info() or {}), "ready": True})
    threading.Thread(target=_accept, args=(engine, listener), daemon=True).start()
    _wait_for_no_client(files)
    files.path("json").unlink(missing_ok=True)
    listener.close()  # and removes the socket
    engine.close()
    return 0  # K.holder and K.lease stay locked until this process has exited


def _accept(engine: Any, listener: Listener) -> None:
    """Each client connection answered on a thread of its own, until the process exits."""
    while True:
        try:
            connection = listener.accept()
        except OSError:  # the listener was closed: the holder is exiting
            return
        threading.Thread(target=_answer, args=(engine, connection), daemon=True).start()


def _record_error(files: EngineFiles, error: Exception) -> None:
    print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
    try:
        payload = pickle.dumps(error)
    except Exception:  # an exception that does not pickle travels as its sentence
        payload = pickle.dumps(RuntimeError(str(error)))
    files.path("error").write_bytes(payload)


def _wait_for_no_client(files: EngineFiles) -> None:
    """Return once no client holds a lease. The lease stays locked until this process has exited, so a newcomer
    waits for it to be gone and then starts a holder of its own."""
    while try_lock(files.path("lease"), fcntl.LOCK_EX) is None:
        time.sleep(LEASE_POLL_SECONDS)


def _answer(engine: Any, connection: Connection) -> None:
    """One client connection's calls, one at a time, until the client closes it."""
    with connection:
        while True:
            try:
                name, args, options = connection.recv()
            except (EOFError, OSError):
                return
            try:
                result = (True, _call(engine, name, args, options))
            except Exception as error:
                result = (False, error)
            try:
                connection.send(result)
            except (pickle.PicklingError, TypeError, AttributeError) as error:
                connection.send((False, RuntimeError(f"The result of {name} could not be sent: {error}")))
            except OSError:
                return


def _call(engine: Any, name: str, args: tuple[Any, ...], options: dict[str, Any]) -> Any:
    if name == PING:
        return os.getpid()
    if name.startswith("_") and name != GETATTR:
        raise AttributeError(f"{name} is not part of the engine's API.")
    if name == GETATTR:
        (attribute,) = args
        if attribute.startswith("_"):
            raise AttributeError(attribute)
        value = getattr(engine, attribute)
        return CALLABLE if callable(value) else value
    return getattr(engine, name)(*args, **options)


def main() -> int:
    files = EngineFiles(Path(sys.argv[1]))
    spec = pickle.load(sys.stdin.buffer)
    with contextlib.suppress(KeyboardInterrupt):
        return serve(files, spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
