"""The two-worker lane (tests/workers.py): files that share a session resource run on one worker, and the costliest
work goes out first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import workers

TESTS = Path(__file__).resolve().parents[1]

# Three tests a file, so no worker is handed a second file before its first is nearly done.
SHARING = """
import pytest

@pytest.fixture
def {fixture}():
    return None

@pytest.mark.parametrize("n", range(3))
def test_it(n, {fixture}):
    pass
"""


def test_files_naming_a_shared_fixture_run_on_one_worker(pytester, inner_pytest):
    pytester.makepyfile(
        test_a=SHARING.format(fixture="ray_cluster"),
        test_b=SHARING.format(fixture="ray_cluster"),
        test_c=SHARING.format(fixture="minilm_server"),
        test_d=SHARING.format(fixture="nothing_shared"),
    )
    result = inner_pytest("-p", "workers", "-n", "2", "--dist", "loadfile", "-v")
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


SUITE_UNITS = workers.units_of(
    [path.relative_to(TESTS.parent).as_posix() for path in sorted(TESTS.rglob("test_*.py"))], TESTS.parent
)


@pytest.mark.parametrize(
    ("file", "unit"),
    [
        ("tests/ray/test_ray_data.py", "ray_cluster"),
        ("tests/ray/test_ray_serve.py", "ray_cluster"),
        ("tests/ray/test_docs_ray.py", "ray_cluster"),
        ("tests/project/test_docs.py", "tests/project/test_docs.py"),  # its blocks on Ray are test_docs_ray's
        ("tests/engine/test_precision.py", "minilm_server"),
        ("tests/engine/test_chunking.py", "minilm_server"),
        # and reranker_server: one unit, each server started once
        ("tests/server/test_http_clients.py", "minilm_server"),
        ("tests/server/test_http_fuzz.py", "minilm_server"),
        ("tests/server/test_request_cost.py", "minilm_server"),  # reranker_server only: in the unit of the files above
        ("tests/remote/test_remote.py", "tests/remote/test_remote.py"),
    ],
)
def test_the_suite_s_shared_resources_are_units(file, unit):
    assert SUITE_UNITS[file] == unit


def test_the_expected_seconds_name_files_of_the_suite():
    """A file that moved or went falls back to a second per test: its figure must follow it."""
    assert sorted(set(workers.EXPECTED_SECONDS) - set(SUITE_UNITS)) == []


def test_the_ray_unit_goes_out_first_and_the_server_unit_next():
    units: dict[str, list[str]] = {}
    for file, unit in SUITE_UNITS.items():
        units.setdefault(unit, []).append(f"{file}::test")
    order = sorted(units, key=lambda unit: -workers.expected_seconds(units[unit]))
    assert order[:2] == ["ray_cluster", "minilm_server"]


def test_a_file_naming_two_shared_fixtures_joins_their_units(tmp_path):
    # Built here, so that this file's own text names no fixture (the scheduler reads it too).
    uses = {"a": ["ray_cluster"], "b": ["reranker_server"], "c": ["minilm_server"], "d": ["reranker_server"]}
    uses["d"].append("minilm_server")
    for name, fixtures in uses.items():
        parameters = "\n    " + ", ".join([*fixtures[1:], "request"])
        looked_up = f"request.getfixturevalue({fixtures[0]!r})"
        # A fixture's name in a comment or a string is no use of it.
        text = f'# ray_cluster\n"""minilm_server"""\ndef test_{name}({parameters}\n):\n    {looked_up}\n'
        (tmp_path / f"test_{name}.py").write_text(text)
    units = workers.units_of([f"test_{name}.py" for name in uses], tmp_path)
    assert units == {
        "test_a.py": "ray_cluster",
        "test_b.py": "minilm_server",
        "test_c.py": "minilm_server",
        "test_d.py": "minilm_server",
    }
    assert workers.units_of(["test_a.py", "test_b.py"], tmp_path)["test_b.py"] == "reranker_server"
