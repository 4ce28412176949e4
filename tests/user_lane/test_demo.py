"""`make demo` as a new user runs it: exit 0, the dtype it ran in, and a verdict at that dtype's bounds (bfloat16
on CPUs with AVX512_BF16, float32 elsewhere; tests/backend/test_bfloat16.py judges real bfloat16 answers on every
CPU class)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from rbln_retrieval.local.engine_args import resolve_dtype

pytestmark = pytest.mark.slow

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def test_the_demo_agrees_in_the_dtype_auto_picks_and_reuses_its_store(tmp_path, monkeypatch, capsys):
    dtype = resolve_dtype("auto", "cpu")
    first = subprocess.run(
        [sys.executable, str(DEMO), "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=1200
    )
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Traceback" not in first.stderr, first.stderr[-3000:]
    out = first.stdout
    assert f"verdict: rbln-retrieval in {dtype} against sentence-transformers in float32" in out, out
    checks = [line.strip() for line in out.splitlines() if line.strip().endswith((" ok", " FAIL"))]
    assert [c.split()[0] for c in checks] == ["vectors", "scores", "rankings", "quality"], out
    assert all(c.endswith(" ok") for c in checks), out
    assert "\n  agree: " in out and "DISAGREE" not in out
    # A second run finds the collection of this dtype whole and embeds nothing: the demo's own ingest step, on the
    # store the first run left, reuses it (a second whole run would only repeat the verdict above).
    monkeypatch.syspath_prepend(str(DEMO.parent))
    demo = importlib.import_module("demo")
    corpus = demo.passages()
    store = demo.Store.open(tmp_path, f"python-docs-rbln-{dtype}", corpus)
    assert store.ready and store.count == len(corpus)

    def embed(texts):
        raise AssertionError("a second run must not embed the corpus again")

    capsys.readouterr()
    demo._ingest("ingest", store, corpus, embed)
    assert f"reusing Chroma collection 'python-docs-rbln-{dtype}'" in capsys.readouterr().out
