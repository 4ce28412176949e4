"""Where the suite's wall time goes: with ``--timeline=PATH`` the session's controller writes one JSON line per test
phase (its worker, node id, phase, start and stop), the session's start and, every 10 s, the machine's CPU busy
share and load average from /proc, so a run shows when a worker waited and when the cores stood idle
(bench/suite_timeline.py reads it). Written with ``=``: pytest finds its rootdir, and so this plugin, from the
arguments before it knows the option, and a separate path would be taken for a test path.
Off unless asked; nothing here changes what a test sees. Loaded from the root conftest.py (``pytest_plugins``);
imports nothing of the test helpers."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

SAMPLE_SECONDS = 10.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--timeline", metavar="PATH", help="write each test phase and the CPU's busy share as JSON lines")


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


class Timeline:
    def __init__(self, path: Path) -> None:
        self._out: IO[str] = path.open("w", encoding="utf-8")
        self._lock = threading.Lock()
        self.write({"session": time.time()})  # before collection and the workers' start
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="timeline-cpu", daemon=True)
        self._sampler.start()

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._out.write(json.dumps(record) + "\n")
            self._out.flush()

    def _sample(self) -> None:
        busy, total = _cpu_times()
        while not self._stop.wait(SAMPLE_SECONDS):
            now_busy, now_total = _cpu_times()
            share = (now_busy - busy) / max(1, now_total - total)
            busy, total = now_busy, now_total
            self.write({"cpu": round(share * (os.cpu_count() or 1), 3), "load": os.getloadavg()[0], "at": time.time()})

    def close(self) -> None:
        self._stop.set()
        self._sampler.join()
        self._out.close()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)  # pytest-xdist's worker, on the controller
        worker = node.gateway.id if node is not None else "main"
        self.write(
            {"worker": worker, "test": report.nodeid, "phase": report.when, "start": report.start, "stop": report.stop}
        )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--timeline")
    if path and not hasattr(config, "workerinput"):  # the controller writes; workers hand it their reports
        timeline = Timeline(Path(path))
        config.pluginmanager.register(timeline, "timeline-writer")
        config.add_cleanup(timeline.close)
