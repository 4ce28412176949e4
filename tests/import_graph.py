"""Every import of a package's modules, read from their source (module level, deferred inside a function, or
typing-only), and the cycle finder: the import-rule tests of tests/project/test_import_graph.py and the backend's
stage rules of tests/backend/test_layout.py read the same graph."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    target: str  # the imported module, as absolute a dotted name as the source allows
    when: str  # "module" (runs on import), "deferred" (inside a function) or "typing" (under TYPE_CHECKING)
    line: int


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(
    source: str, module: str, *, is_package: bool = False, modules: frozenset[str] = frozenset()
) -> list[Import]:
    """Every import in ``source`` (the text of ``module``), wherever it stands. ``from X import name`` imports the
    module ``X.name`` when ``modules`` holds it, else ``X``."""
    found: list[Import] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, when: str) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, when, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append(Import(candidate if candidate in modules else base, when, node.lineno))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, "typing")
            for child in node.orelse:
                visit(child, when)
            return
        inner = "deferred" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else when
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(source), "module")
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path [a, b, ..., a], or None when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path = [root]
        stack = [iter(sorted(graph.get(root, ())))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return [*path[path.index(child) :], child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of the package under ``root``."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(root: Path, package: str) -> tuple[dict[str, set[str]], dict[str, list[Import]]]:
    """(module -> the package's modules it imports, module -> all its imports), from the files under ``root``."""
    files = package_modules(root, package)
    names = frozenset(files)
    every = {
        name: imports_of(path.read_text(encoding="utf-8"), name, is_package=path.name == "__init__.py", modules=names)
        for name, path in files.items()
    }
    graph = {name: {i.target for i in found if i.target in names and i.target != name} for name, found in every.items()}
    return graph, every
