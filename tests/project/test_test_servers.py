"""The suite's server helper (tests/servers.py) leaves nothing behind a test process that dies: a process it starts
gets SIGTERM when the process that started it is killed, checked on a stand-in child (no server start)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
from servers import outliving

TESTS = Path(__file__).resolve().parents[1]
PARENT = textwrap.dedent(
    f"""
    import subprocess, sys, time
    sys.path.insert(0, {str(TESTS)!r})
    from servers import _stop_with_parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True,
                             preexec_fn=_stop_with_parent)
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_a_started_process_is_stopped_when_the_test_process_is_killed():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    child = psutil.Process(int(parent.stdout.readline()))
    assert child.is_running()
    parent.kill()  # SIGKILL: no finalizer, no fixture teardown runs
    parent.wait()
    assert not outliving([child], timeout=60), "the child outlived the process that started it"
