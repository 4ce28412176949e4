"""The watch an engine's vLLM processes keep over the process that started them (``backend/lifetime.py``), on
stand-in processes started as vLLM starts its engine core (multiprocessing): no engine start. The engine
core itself, SIGKILLed starter and all: tests/engine/test_faults.py and the user lane's SPLADE server."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
from servers import outliving

from rbln_retrieval.backend import lifetime

STARTER = """
import multiprocessing, multiprocessing.connection, os, sys, time
from rbln_retrieval.backend import lifetime

def engine_process(late):
    if late:  # the starter dies before the watch begins, as it can while vLLM's process imports for seconds
        multiprocessing.connection.wait([multiprocessing.parent_process().sentinel])
    print("watching" if lifetime.watch_starter() else "not watching", flush=True)
    time.sleep(600)

if __name__ == "__main__":
    os.environ.update(lifetime.starter_env())
    method, late = sys.argv[1], sys.argv[2] == "late"
    child = multiprocessing.get_context(method).Process(target=engine_process, args=(late,))
    child.start()
    print(child.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("when", ["watching", "late"])
@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_process_stops_once_the_process_that_started_it_is_killed(tmp_path, method, when):
    """Under each of multiprocessing's start methods (vLLM's VLLM_WORKER_MULTIPROC_METHOD): under forkserver the
    process's parent is the fork server, not its starter."""
    script, log = tmp_path / "starter.py", tmp_path / "stderr.txt"
    script.write_text(STARTER)
    with log.open("w") as stderr:
        command = [sys.executable, str(script), method, when]
        starter = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        child = psutil.Process(int(starter.stdout.readline()))
        if when == "watching":
            assert starter.stdout.readline().strip() == "watching"
            # While the starter lives, so does the process: a watch that mistook the fork server for its starter
            # stopped it at once (a failure shows within the wait; a pass never depends on it).
            assert not psutil.wait_procs([child], timeout=2)[0], "the process stopped while its starter lived"
    finally:
        starter.kill()
        starter.wait()
    assert not outliving([child], timeout=60), "the process outlived the process that started it"
    # Late, the watch finds the starter gone at once: its SIGTERM may end the process before it prints.
    assert f"(pid {starter.pid}) has exited without closing it; stopping." in log.read_text()


def test_only_a_process_the_starter_started_watches_it(monkeypatch):
    monkeypatch.setattr(lifetime, "_watching", False)
    # The starter itself (an in-process engine loads vLLM's plugins in the caller's own process): no watch.
    monkeypatch.setenv(lifetime.STARTER_ENV, str(os.getpid()))
    assert not lifetime.watch_starter()
    # A starter that is not this process's parent (vLLM's workers, below the engine core): no watch.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setenv(lifetime.STARTER_ENV, str(other.pid))
        assert not lifetime.watch_starter()
    finally:
        other.kill()
        other.wait()
    monkeypatch.delenv(lifetime.STARTER_ENV)
    assert not lifetime.watch_starter()
    assert not lifetime._watching
