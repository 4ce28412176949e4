"""The suite's engine-start budget (tests/engine_budget.py) fails a session past the limits the docs state, and
passes one within them."""

from __future__ import annotations

from pathlib import Path

import engine_budget
import pytest

TESTS = Path(__file__).resolve().parent

STARTS = """
import engine_budget

def test_starts(request):
    budget = request.config.stash[engine_budget.BUDGET]
    engines, servers = budget.limits
    budget.in_process["tests/test_engines.py"] += engines + {extra}
    budget.servers["tests/test_servers.py"] += servers
"""


def test_the_docs_state_both_limits():
    engines, servers = engine_budget.stated_limits()
    assert 0 < servers < engines


@pytest.mark.parametrize(("extra", "status"), [(0, 0), (1, 1)], ids=["at-the-limit", "one-past-it"])
def test_a_session_past_the_engine_start_limit_fails(pytester, monkeypatch, extra, status):
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{TESTS.parent}")  # the helpers, and this checkout
    pytester.makepyfile(test_inner=STARTS.format(extra=extra))
    result = pytester.runpytest_subprocess("-p", "engine_budget", "-p", "no:cacheprovider")
    assert result.ret == status, result.stdout.str()
    result.assert_outcomes(passed=1)
    assert ("over budget" in result.stdout.str()) == bool(status)
    lines = ["*engine starts: * of at most *", "*engines servers  file", "* 0  tests/test_engines.py"]
    result.stdout.fnmatch_lines([*lines, "*  tests/test_servers.py"])
