"""The suite's budget, held by the suite: every engine start and every `rbln-retrieval serve` start of a session is
counted, and the session fails when the count passes the limits docs/development.md states ("Engine-start budget").
An engine start costs 10-25 s on the machines the suite runs on, and most of the suite's time is engine starts, so
the counts are what a new test adds to the suite's time.

Counted: engines started in the test process (PoolingEngine, shared or not, including restarts), engines started
in the processes the tests start (CLI, examples, Ray workers: tests/engine_count/sitecustomize.py, put on the
PYTHONPATH the suite's subprocesses inherit) and servers (tests/servers.py). A shared engine of the test process
(``PoolingEngine.shared``: the session engines, framework objects with the tests' options) starts once per worker
that needs it, and which worker needs it depends on how the files fell to the workers in that run: it counts as
often as the worker that started it most often did, so the judged count is the same whichever worker ran what (the
copies on other workers are printed beside it). Loaded from the root conftest.py
(``pytest_plugins``); imports nothing of the test helpers but ``servers``. Under pytest-xdist each worker counts
its own and hands its counts to the controller (``workeroutput``), which sums them, prints them and fails the
session."""

from __future__ import annotations

import os
import re
import tempfile
from collections import Counter
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs" / "development.md"
COUNTER = Path(__file__).resolve().parent / "engine_count"
LIMITS = re.compile(r"at most\s+\*\*(\d+) engine starts\*\*\s+and\s+\*\*(\d+) server starts\*\*")


def stated_limits() -> tuple[int, int]:
    """(engine starts, server starts) the docs allow one session."""
    match = LIMITS.search(DOCS.read_text(encoding="utf-8"))
    if match is None:
        raise pytest.UsageError(f"{DOCS} states no engine-start budget (a line matching {LIMITS.pattern!r})")
    return int(match[1]), int(match[2])


COUNTED = ("in_process", "servers", "subprocesses")
# The shared engine (its model's family, directory name and options) whose start is under way in this worker, if any.
_starting_shared: str | None = None


class EngineBudget:
    """Starts per test file: in the test process, in its subprocesses (one line each in ``log``), of servers."""

    def __init__(self, log: Path, limits: tuple[int, int]):
        self.log = log
        self.limits = limits
        self.in_process: Counter[str] = Counter()
        self.servers: Counter[str] = Counter()
        self.subprocesses: Counter[str] = Counter()
        self.shared: Counter[str] = Counter()  # this worker's starts of each shared engine
        self.shared_per_worker: list[Counter[str]] = []  # the controller's: each worker's ``shared``

    def read_subprocess_starts(self) -> None:
        if self.log.exists():
            self.subprocesses.update(self.log.read_text(encoding="utf-8").splitlines())
            self.log.unlink()

    def shared_starts(self) -> tuple[Counter[str], int]:
        """(each shared engine's starts in the worker that started it most often, the other workers' copies)."""
        workers = self.shared_per_worker or [self.shared]
        judged: Counter[str] = Counter()
        for worker in workers:
            judged |= worker
        return judged, sum(sum(worker.values()) for worker in workers) - sum(judged.values())

    def totals(self) -> tuple[int, int]:
        shared = sum(self.shared_starts()[0].values())
        return sum(self.in_process.values()) + sum(self.subprocesses.values()) + shared, sum(self.servers.values())

    def counts(self) -> dict[str, dict[str, int]]:
        return {name: dict(getattr(self, name)) for name in (*COUNTED, "shared")}

    def add(self, counts: dict[str, dict[str, int]]) -> None:
        """Counts of another process's session (a worker's), added to these."""
        for name in COUNTED:
            getattr(self, name).update(counts[name])
        self.shared_per_worker.append(Counter(counts["shared"]))

    def over(self) -> bool:
        engines, servers = self.totals()
        return engines > self.limits[0] or servers > self.limits[1]


BUDGET = pytest.StashKey[EngineBudget]()


def _current_file() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "outside a test").split("::")[0]


@pytest.hookimpl(trylast=True)  # after the root conftest has pinned vLLM's platform
def pytest_configure(config: pytest.Config) -> None:
    from servers import Server

    from rbln_retrieval.engines.shared import EngineSpec
    from rbln_retrieval.local.engine import PoolingEngine

    log = Path(tempfile.mkdtemp(prefix="engine-starts-")) / "subprocesses"
    budget = config.stash[BUDGET] = EngineBudget(log, stated_limits())
    os.environ["RBLN_TEST_ENGINE_STARTS"] = str(log)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(COUNTER), *(p for p in paths if p and p != str(COUNTER))])

    # A pytest-xdist worker starts with the counter the controller put on PYTHONPATH: its own starts are counted
    # here, in process, and not again in the controller's log.
    start = getattr(PoolingEngine._start, "__wrapped__", PoolingEngine._start)

    async def counted_start(self):
        if _starting_shared is not None:
            budget.shared[_starting_shared] += 1
        else:
            budget.in_process[_current_file()] += 1
        await start(self)

    PoolingEngine._start = counted_start  # type: ignore[method-assign]
    spec_start = EngineSpec.start

    def shared_start(spec):
        global _starting_shared
        if not hasattr(spec.model, "path"):  # a remote client's engine: no engine starts here
            return spec_start(spec)
        _starting_shared = " ".join(
            (spec.model.family.name, Path(spec.model.path).name, spec.options.model_dump_json(exclude_defaults=True))
        )
        try:
            return spec_start(spec)
        finally:
            _starting_shared = None

    EngineSpec.start = shared_start  # type: ignore[method-assign]
    server_init = Server.__init__

    def counted_server(self, *args, **kwargs):
        budget.servers[_current_file()] += 1
        server_init(self, *args, **kwargs)

    Server.__init__ = counted_server  # type: ignore[method-assign]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A pytest-xdist worker is done: its counts join the controller's."""
    counts = getattr(node, "workeroutput", {}).get("engine_budget")
    if counts is not None:
        node.config.stash[BUDGET].add(counts)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    budget = session.config.stash[BUDGET]
    budget.read_subprocess_starts()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: the controller judges the sum
        workeroutput["engine_budget"] = budget.counts()
    elif budget.over():
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)  # after the slowest durations: the lines just above the summary, where CI logs end
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    budget = config.stash[BUDGET]
    engines, servers = budget.totals()
    engine_limit, server_limit = budget.limits
    terminalreporter.section("engine-start budget (docs/development.md)", red=budget.over())
    write = terminalreporter.write_line
    elsewhere = sum(budget.subprocesses.values())
    write(f"engine starts: {engines} of at most {engine_limit} ({elsewhere} in processes the tests started)")
    write(f"server starts: {servers} of at most {server_limit}")
    shared, copies = budget.shared_starts()
    write(f"shared engines of the test processes: {sum(shared.values())} ({copies} more on other workers, not counted)")
    for key, count in sorted(shared.items(), key=lambda item: (-item[1], item[0])):
        write(f"  {count:7d}          {key}")
    engines_per_file = budget.in_process + budget.subprocesses
    write("  engines servers  file")
    for file in sorted(engines_per_file | budget.servers, key=lambda f: (-engines_per_file[f] - budget.servers[f], f)):
        write(f"  {engines_per_file[file]:7d} {budget.servers[file]:7d}  {file}")
    # Once more as the last line before pytest's summary: CI's log shows only its end.
    totals = f"engines {engines} of {engine_limit}, servers {servers} of {server_limit}"
    if budget.over():
        write(f"over budget ({totals}): share engines (docs/development.md) before raising the limit", red=True)
    else:
        write(f"within budget ({totals})")
