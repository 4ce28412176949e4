"""The suite's engine-start budget (tests/engine_budget.py) fails a session past the limits the docs state, and
passes one within them, also when two pytest-xdist workers count their halves."""

from __future__ import annotations

from pathlib import Path

import engine_budget
import pytest

STARTS = """
import engine_budget

def test_starts(request):
    budget = request.config.stash[engine_budget.BUDGET]
    engines, servers = budget.limits
    budget.in_process["tests/test_engines.py"] += engines + {extra}
    budget.servers["tests/test_servers.py"] += servers
"""

# Two files on two workers: all servers and one engine short of the limit on one, ``extra`` engine starts of a
# subprocess (its line in the worker's log) on the other.
FIRST = """
import engine_budget

def test_first(request):
    budget = request.config.stash[engine_budget.BUDGET]
    engines, servers = budget.limits
    budget.in_process["tests/test_engines.py"] += engines - 1
    budget.servers["tests/test_servers.py"] += servers
"""
SECOND = """
import os

def test_second():
    with open(os.environ["RBLN_TEST_ENGINE_STARTS"], "a") as log:
        log.write("tests/test_subprocesses.py\\n" * {extra})
"""


def test_the_processes_tests_start_count_their_engine_starts():
    """A process a test starts inherits the counter (its sitecustomize) and the log it writes to."""
    import os
    import subprocess
    import sys

    probe = "import os, sys; print(sys.modules['sitecustomize'].__file__, os.environ['RBLN_TEST_ENGINE_STARTS'])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert Path(out[0]).parent == engine_budget.COUNTER and out[1] == os.environ["RBLN_TEST_ENGINE_STARTS"]


def test_the_docs_state_both_limits():
    engines, servers = engine_budget.stated_limits()
    assert 0 < servers < engines


@pytest.mark.parametrize(("extra", "status"), [(0, 0), (1, 1)], ids=["at-the-limit", "one-past-it"])
def test_a_session_past_the_engine_start_limit_fails(pytester, inner_pytest, extra, status):
    pytester.makepyfile(test_inner=STARTS.format(extra=extra))
    result = inner_pytest("-p", "engine_budget")
    assert result.ret == status, result.stdout.str()
    result.assert_outcomes(passed=1)
    assert ("over budget" in result.stdout.str()) == bool(status)
    lines = ["*engine starts: * of at most *", "*engines servers  file", "* 0  tests/test_engines.py"]
    result.stdout.fnmatch_lines([*lines, "*  tests/test_servers.py"])


@pytest.mark.parametrize(("extra", "status"), [(1, 0), (2, 1)], ids=["at-the-limit", "one-past-it"])
def test_two_workers_counts_add_up(pytester, inner_pytest, extra, status):
    pytester.makepyfile(test_first=FIRST, test_second=SECOND.format(extra=extra))
    result = inner_pytest("-p", "engine_budget", "-p", "workers", "-n", "2", "--dist", "loadfile", "-v")
    assert result.ret == status, result.stdout.str()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines_random(["*gw0*PASSED*", "*gw1*PASSED*"])  # one file on each worker
    assert ("over budget" in result.stdout.str()) == bool(status)
    engines, servers = engine_budget.stated_limits()
    result.stdout.fnmatch_lines([f"*engine starts: {engines - 1 + extra} of at most {engines} ({extra} in *"])
    result.stdout.fnmatch_lines([f"*server starts: {servers} of at most {servers}"])


SHARED = """
import engine_budget

def test_{name}(request):
    budget = request.config.stash[engine_budget.BUDGET]
    budget.shared["bert bert-cls {{}}"] += {starts}
    budget.in_process["tests/test_{name}.py"] += {engines}
"""


def test_a_shared_engine_started_on_both_workers_counts_as_the_busier_worker_started_it(pytester, inner_pytest):
    """Each worker starts its own copy of a session engine, and which files need it on which worker varies from run
    to run: the judged count takes the worker that started it most often (two starts), not the sum (three)."""
    engines = engine_budget.stated_limits()[0]
    pytester.makepyfile(
        test_first=SHARED.format(name="first", starts=2, engines=engines - 2),
        test_second=SHARED.format(name="second", starts=1, engines=0),
    )
    result = inner_pytest("-p", "engine_budget", "-p", "workers", "-n", "2", "--dist", "loadfile", "-v")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines_random(["*gw0*PASSED*", "*gw1*PASSED*"])
    result.stdout.fnmatch_lines(
        [f"*engine starts: {engines} of at most {engines} *", "*shared engines of the test processes: 2 (1 more *"]
    )
