"""The seed side by side in the docs is the recorded run: docs/rbln.md's table and README.md's row equal what
bench/seed_tables.py renders from bench/results/seed_side_by_side.json (no engine starts; after a new
`bench/seed_side_by_side.py` run, paste what it prints)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _seed_tables():
    spec = importlib.util.spec_from_file_location("seed_tables", ROOT / "bench" / "seed_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLES = _seed_tables()
RESULT = json.loads(TABLES.RESULTS.read_text())


def table_starting(text: str, first_line: str) -> str:
    """The Markdown table of ``text`` whose header line is ``first_line`` ("" when there is none)."""
    lines = text.splitlines()
    if first_line not in lines:
        return ""
    start = lines.index(first_line)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[start:end])


def test_the_recorded_run_measures_every_family_on_both_systems():
    assert [row["family"] for row in RESULT["measured"]] == [
        "all-MiniLM-L6-v2",
        "xlm-roberta-mean",
        "xlm-roberta-cross-encoder",
    ]
    assert all(system in row for row in RESULT["measured"] for system in TABLES.SYSTEMS)


def test_docs_table_is_the_recorded_run():
    expected = TABLES.measured_table(RESULT["measured"])
    docs = (ROOT / "docs" / "rbln.md").read_text(encoding="utf-8")
    assert table_starting(docs, expected.splitlines()[0]) == expected


def test_readme_row_is_the_recorded_run():
    expected = TABLES.readme_row(RESULT["measured"])
    label = expected.split(":")[0]
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert [line for line in readme if line.startswith(label)] == [expected]
