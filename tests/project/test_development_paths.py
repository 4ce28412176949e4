"""docs/development.md draws the path of one option and one text from each framework class to the runner; this
holds the drawing to the code: every stop's function exists in its file, and each stop calls the next stop's
function by name, or holds the text its ``via`` names (where the hand-off is a call of an attribute or of vLLM)."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "development.md"
PATH = re.compile(r"<!-- path: (?P<name>[^>]+) -->\n```text\n(?P<body>.*?)```", re.S)


def paths() -> dict[str, list[tuple[str, str, str]]]:
    """Each drawn path: (file, function, via text) per stop; a line in parentheses (vLLM's own part) is a stop
    ("", "", "") across which nothing is checked."""
    drawn = {}
    for found in PATH.finditer(DOC.read_text(encoding="utf-8")):
        stops = []
        for line in found["body"].splitlines():
            if not line.strip():
                continue
            if line.startswith("("):
                stops.append(("", "", ""))
                continue
            file, function, *rest = line.split(maxsplit=2)
            note = rest[0] if rest else ""
            stops.append((file, function, note[4:].strip() if note.startswith("via ") else ""))
        drawn[found["name"]] = stops
    return drawn


def definition(file: str, qualname: str) -> ast.AST:
    """The class or function ``qualname`` (Class.method) of ``file``."""
    tree: ast.AST = ast.parse((REPO / file).read_text(encoding="utf-8"))
    for part in qualname.split("."):
        tree = next(
            node
            for node in ast.iter_child_nodes(tree)
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == part
        )
    return tree


def called_names(node: ast.AST) -> set[str]:
    names = set()
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = call.func
        names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


DRAWN = paths()


def test_the_drawing_has_each_framework_class_and_both_values():
    options = {"option from langchain", "option from llama-index embedding", "option from llama-index reranker"}
    assert options | {"option into the engine", "option into the runner"} <= set(DRAWN)
    texts = {"langchain embeddings", "langchain reranker", "llama-index embedding", "llama-index reranker"}
    assert {f"text from {origin}" for origin in texts | {"RemoteEngine"}} | {"text into the runner"} <= set(DRAWN)
    # The option drawn is dtype: the stops that hand it on by name say so.
    assert "dtype=self.dtype" in {via for _, _, via in DRAWN["option from langchain"]}
    assert '"dtype": dtype' in {via for _, _, via in DRAWN["option into the engine"]}


@pytest.mark.parametrize("name", sorted(DRAWN))
def test_each_stop_exists_and_hands_on_to_the_next(name):
    stops = DRAWN[name]
    assert len(stops) >= 2
    for (file, function, via), (_, following, _) in itertools.pairwise(stops):
        if not file or not following:
            continue  # vLLM's part: it is drawn, not checked
        try:
            node = definition(file, function)
        except (StopIteration, FileNotFoundError):
            pytest.fail(f"{name}: {file} has no {function}")
        source = ast.get_source_segment((REPO / file).read_text(encoding="utf-8"), node) or ""
        if via:
            assert via in source, f"{name}: {file}::{function} does not hold {via!r}"
        else:
            callee = following.rpartition(".")[2]
            assert callee in called_names(node) or f".{callee}(" in source, f"{name}: {function} calls no {callee}"
    last_file, last_function, _ = stops[-1]
    definition(last_file, last_function)
