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
    when this process now watches its starter.

    vLLM starts its processes with multiprocessing, which keeps the starting pid and a pipe whose other end only the
    starter holds: the pipe's end says the starter died, even before this watch began, and under any start method
    (under forkserver the parent pid is the fork server's). A process started otherwise has its parent pid polled."""
    global _watching
    named = os.environ.get(STARTER_ENV, "")
    if _watching or not named.isdigit():
        return False
    starter = int(named)
    parent = multiprocessing.parent_process()
    sentinel = parent.sentinel if parent is not None and parent.pid == starter else None
    if sentinel is None and os.getppid() != starter:
        return False
    _watching = True
    threading.Thread(target=_stop_after, args=(starter, sentinel), name="rbln-retrieval-starter", daemon=True).start()
    return True


def _stop_after(starter: int, sentinel: int | None) -> None:
    if sentinel is not None:
        multiprocessing.connection.wait([sentinel])
    else:  # a dead parent's children are handed to init (or a subreaper): the parent pid changes exactly then
        while os.getppid() == starter:
            time.sleep(POLL_SECONDS)
    logger.warning(
        "The process that started this vLLM engine process (pid %d) has exited without closing it; stopping.",
        starter,
    )
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_SECONDS)
    os._exit(1)
