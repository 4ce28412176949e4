"""`rbln-retrieval` as a subprocess of this interpreter (``python -m rbln_retrieval.cli``), and the one line of
error a failing command prints: tests/user_lane/test_cli.py and the CLI checks of other areas run commands this way."""

from __future__ import annotations

import subprocess
import sys


def cli(*args: str, stdin: str | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rbln_retrieval.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]
