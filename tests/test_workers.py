"""The two-worker lane (tests/workers.py): files that share a session resource run on one worker, and the costliest
work goes out first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import workers

TESTS = Path(__file__).resolve().parent

# Three tests a file, so no worker is handed a second file before its first is nearly done.
SHARING = '''
import pytest

@pytest.mark.parametrize("n", range(3))
def test_it(n):
    """Runs beside {fixture}."""
'''


def test_files_naming_a_shared_fixture_run_on_one_worker(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"{TESTS}:{TESTS.parent}")
    pytester.makepyfile(
        test_a=SHARING.format(fixture="ray_cluster"),
        test_b=SHARING.format(fixture="ray_cluster"),
        test_c=SHARING.format(fixture="minilm_server"),
        test_d=SHARING.format(fixture="nothing shared"),
    )
    result = pytester.runpytest_subprocess(
        "-p", "workers", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "-v"
    )
    result.assert_outcomes(passed=12)
    ran_on = {
        file: worker for worker, file in re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED (test_\w)\.py", result.stdout.str())
    }
    assert ran_on["test_a"] == ran_on["test_b"], result.stdout.str()  # xdist's loadfile: one on each worker
    assert len(set(ran_on.values())) == 2, result.stdout.str()


def test_the_costliest_unit_goes_first():
    parity = ["tests/backend/test_parity.py::test_x"]
    many = [f"tests/test_plain.py::test_{i}" for i in range(20)]
    few = ["tests/test_other.py::test_0", "tests/test_other.py::test_1"]
    assert workers.expected_seconds(parity) > workers.expected_seconds(many) > workers.expected_seconds(few)


@pytest.mark.parametrize(
    ("file", "unit"),
    [
        ("tests/test_ray_data.py", "ray_cluster"),
        ("tests/test_ray_serve.py", "ray_cluster"),
        ("tests/test_docs.py", "ray_cluster"),
        ("tests/test_precision.py", "minilm_server"),
        ("tests/test_chunking.py", "minilm_server"),
        ("tests/test_http_clients.py", "minilm_server"),  # and reranker_server: one unit, each server started once
        ("tests/test_http_fuzz.py", "minilm_server"),
        ("tests/test_remote.py", "tests/test_remote.py"),
    ],
)
def test_the_suite_s_shared_resources_are_units(file, unit):
    assert workers.unit_of(file, TESTS.parent) == unit
