"""A vLLM process started for an engine ends when the process that started it ends.

vLLM's engine-core process (and, under ``serve``, its API-server processes) watches nothing above it: when the
process that started the engine dies without closing it (SIGKILL, the kernel's OOM killer, a Ray actor killed,
a crashed notebook kernel), the engine core keeps its gigabyte of host memory and, on an NPU, its device, until
someone finds and kills it, and the restarted application cannot open that device. vLLM's own workers watch their
engine core through a pipe; this gives the engine's top processes the same watch over their starter.

The starter's pid travels in ``STARTER_ENV``, set while an engine starts (``backend.activated``); a process that
pid started watches it from a daemon thread (from vLLM's plugin loading, seconds into the process's life: a starter
that died before then is seen as gone at once), and once it is gone sends itself SIGTERM (vLLM's clean
shutdown, which also stops its workers), then exits outright if that has not ended it within ``GRACE_SECONDS``.
The starting process is watched, not the thread that spawned the process (``PR_SET_PDEATHSIG`` fires when that
thread ends: a Ray Serve replica starts its engines on a pool thread). Processes further down (vLLM's workers)
have another parent and are left to vLLM's own watch.

Stages it may import: nothing
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

STARTER_ENV = "RBLN_RETRIEVAL_STARTER_PID"
POLL_SECONDS = 0.5
GRACE_SECONDS = 15.0

_watching = False


def starter_env() -> dict[str, str]:
    """The environment that makes the vLLM processes this process starts watch it."""
    return {STARTER_ENV: str(os.getpid())}


def watch_starter() -> bool:
    """In a process started by the process named in ``STARTER_ENV``: watch it, and stop once it is gone. True
    when this process now watches its starter."""
    global _watching
    starter = os.environ.get(STARTER_ENV, "")
    if _watching or not starter.isdigit():
        return False
    gone = _starter_gone(int(starter))
    if gone is None:
        return False
    _watching = True
    threading.Thread(target=_stop_after, args=(int(starter), gone), name="rbln-retrieval-starter", daemon=True).start()
    return True


def _starter_gone(starter: int) -> Callable[[], None] | None:
    """A call that returns once ``starter`` has died, or None when ``starter`` did not start this process.

    vLLM starts its processes with multiprocessing, which keeps the starting pid and a pipe whose other end only the
    starter holds: the pipe's end says the starter died, even before this watch began, and under any start method
    (under forkserver the parent pid is the fork server's). Otherwise the parent pid is polled: a dead parent's
    children are handed to init (or a subreaper), and the parent pid changes exactly then."""
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid == starter and parent.sentinel is not None:
        sentinel = parent.sentinel

        def closed() -> None:
            multiprocessing.connection.wait([sentinel])

        return closed
    if os.getppid() == starter:

        def polled() -> None:
            while os.getppid() == starter:
                time.sleep(POLL_SECONDS)

        return polled
    return None


def _stop_after(starter: int, gone: Callable[[], None]) -> None:
    gone()
    logger.warning(
        "The process that started this vLLM engine process (pid %d) has exited without closing it; stopping.",
        starter,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)
