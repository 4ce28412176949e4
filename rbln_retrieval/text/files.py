"""Texts from files or stdin, as the command line reads them: one text per line (blank lines skipped) or JSONL
objects with a "text" field (files ending in .jsonl/.ndjson, and stdin whose first non-blank line is a JSON object,
unless the format is named).

Imports: nothing of the package.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

JSONL_SUFFIXES = (".jsonl", ".ndjson")


def read_texts(files: Sequence[str], fmt: str = "auto", stdin: TextIO | None = None) -> list[str]:
    """Texts from ``files`` ('-' or none: stdin) in order; raises ValueError naming the bad file and line."""
    texts: list[str] = []
    for name in files or ["-"]:
        if name == "-":
            texts.extend(_parse((stdin or sys.stdin).read().splitlines(), "stdin", fmt))
        else:
            path = Path(name)
            if path.is_dir():
                raise IsADirectoryError(f"{name} is a directory; pass text or JSONL files.")
            by_suffix = "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "lines"
            fmt_for_file = by_suffix if fmt == "auto" else fmt
            with path.open(encoding="utf-8") as handle:
                texts.extend(_parse(handle.read().splitlines(), name, fmt_for_file))
    return texts


def _parse(lines: list[str], name: str, fmt: str) -> Iterator[str]:
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if fmt == "auto":
        fmt = "jsonl" if numbered and _is_json_object(numbered[0][1]) else "lines"
    if fmt == "lines":
        yield from (line for _, line in numbered)
        return
    for n, line in numbered:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {n} of {name} is not valid JSON ({exc.msg}).") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f'line {n} of {name} has no "text" string.')
        yield row["text"]


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False
