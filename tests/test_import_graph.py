"""The package's import graph: no cycle among rbln_retrieval's modules, deferred imports included, and every room
imports only what its docstring allows.

Every ``import`` and ``from ... import`` of every module under rbln_retrieval/ counts, wherever it is: at module
level, inside a function (a deferred import) or under ``if TYPE_CHECKING:`` (a typing-only one). A room is a
subpackage (models, text, results, engines, local, remote, server, frameworks, backend, ray) or a top-level module
(errors, cpu_features, quiet, cli, doctor, and the package itself, the public API). Its rule is two lines of its
docstring (the subpackage's ``__init__.py`` or the top-level module):

    May import: errors, models          (the other rooms it may import; "nothing" for none)
    Engine libraries: vllm (deferred)   (vllm, torch, transformers: at module level, "(deferred)": only inside
                                         functions or for typing, or "none")

ray/ states its rules in RULES_OUTSIDE_DOCSTRINGS below (its files are edited in another branch; the rules move into
its docstring once that merges). Within backend/, the stages' own rules are held by
tests/backend/test_layout.py.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "rbln_retrieval"
ENGINE_LIBRARIES = ("vllm", "torch", "transformers")
FRAMEWORKS = ("langchain", "langchain_core", "langchain_rbln", "llama_index")

# Rules of the rooms whose files this branch may not edit beyond their import lines: (may import, engine libraries).
RULES_OUTSIDE_DOCSTRINGS = {
    "ray": ("local, server, backend", "vllm (deferred)"),
}
# What the framework integrations may import of this package: the public API and the rooms made for them.
INTEGRATIONS_MAY_IMPORT = {"rbln_retrieval", "frameworks", "text", "results", "models"}


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


def room_of(module: str) -> str:
    """rbln_retrieval.local.engine -> "local"; rbln_retrieval.errors -> "errors"; rbln_retrieval -> "rbln_retrieval"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


@dataclass(frozen=True)
class Rule:
    rooms: frozenset[str]
    libraries: dict[str, str]  # library -> "module" or "deferred"; a library not named is not allowed


def parse_rule(may_import: str, libraries: str) -> Rule:
    rooms = frozenset() if may_import.strip() == "nothing" else frozenset(r.strip() for r in may_import.split(","))
    allowed: dict[str, str] = {}
    if libraries.strip() != "none":
        for item in libraries.split(","):
            name, _, deferred = item.strip().partition(" ")
            assert name in ENGINE_LIBRARIES and deferred in ("", "(deferred)"), f"unreadable: {item!r}"
            allowed[name] = "deferred" if deferred else "module"
    return Rule(rooms, allowed)


def room_rules(root: Path, package: str) -> dict[str, Rule]:
    """Each room's rule, read from its docstring (or RULES_OUTSIDE_DOCSTRINGS)."""
    rules = {room: parse_rule(*rule) for room, rule in RULES_OUTSIDE_DOCSTRINGS.items()}
    for name, path in package_modules(root, package).items():
        room = room_of(name)
        is_room_file = name.count(".") == 1 and (path.name == "__init__.py" or path.parent == root / package)
        if room in rules or not (is_room_file or name == package):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        may = re.search(r"^May import: (.+)$", doc, re.MULTILINE)
        libs = re.search(r"^Engine libraries: (.+)$", doc, re.MULTILINE)
        assert may and libs, f"{path.relative_to(root)}: no 'May import:' and 'Engine libraries:' lines"
        rules[room] = parse_rule(may.group(1), libs.group(1))
    return rules


GRAPH, IMPORTS = import_graph(REPO, PACKAGE)
RULES = room_rules(REPO, PACKAGE)


# -- the cycle finder and the parser, on synthetic input ------------------------------------------------------------
def test_find_cycle_reports_the_modules_of_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle


def test_a_cycle_through_a_deferred_or_a_typing_only_import_is_found(tmp_path):
    """The two cycles this tree had: engine <-> shared through a function-level import, families <-> prompts
    through a TYPE_CHECKING import."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "engine.py").write_text("from pkg.shared import Handle\n")
    (pkg / "shared.py").write_text("def start():\n    from pkg.engine import Engine\n")
    (pkg / "families.py").write_text("from pkg import prompts\n")
    (pkg / "prompts.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.families import Family\n"
    )
    graph, found = import_graph(tmp_path, "pkg")
    assert find_cycle(graph) == ["pkg.engine", "pkg.shared", "pkg.engine"]
    del graph["pkg.engine"]
    assert find_cycle(graph) == ["pkg.families", "pkg.prompts", "pkg.families"]
    assert [(i.target, i.when) for i in found["pkg.shared"]] == [("pkg.engine", "deferred")]
    assert [(i.target, i.when) for i in found["pkg.prompts"]] == [("typing", "module"), ("pkg.families", "typing")]


# -- this package ---------------------------------------------------------------------------------------------------
def test_the_package_has_no_import_cycle():
    assert len(GRAPH) > 40  # every module was read
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_rooms_are_layered():
    """The rules themselves allow no cycle between rooms, so each room can be read after the ones it imports."""
    allowed = {room: set(rule.rooms) for room, rule in RULES.items()}
    assert find_cycle(allowed) is None, "the rooms' rules form a cycle: " + " -> ".join(find_cycle(allowed) or [])


def test_every_room_imports_only_the_rooms_its_docstring_allows():
    wrong = [
        f"{module} imports {target} (room {room_of(target)!r}; {room_of(module)!r} may import: "
        f"{', '.join(sorted(RULES[room_of(module)].rooms)) or 'nothing'})"
        for module, targets in sorted(GRAPH.items())
        for target in sorted(targets)
        if room_of(target) != room_of(module) and room_of(target) not in RULES[room_of(module)].rooms
    ]
    assert wrong == []


def test_only_the_backend_imports_its_modules():
    """The rest of the package reaches the backend through its front door, the package ``rbln_retrieval.backend``
    (a config string naming a backend class for vLLM to load is not an import, and is the backend's own)."""
    backend = f"{PACKAGE}.backend"
    wrong = [
        f"{module}:{i.line} imports {i.target}"
        for module, found in sorted(IMPORTS.items())
        if room_of(module) != "backend"
        for i in found
        if i.target.startswith(backend + ".")
    ]
    assert wrong == []


def test_every_room_imports_only_the_engine_libraries_its_docstring_allows():
    wrong = []
    for module, found in sorted(IMPORTS.items()):
        allowed = RULES[room_of(module)].libraries
        for i in found:
            library = i.target.partition(".")[0]
            if library not in ENGINE_LIBRARIES:
                continue
            if library not in allowed or (allowed[library] == "deferred" and i.when == "module"):
                wrong.append(f"{module}:{i.line} imports {i.target} ({i.when}); allowed: {allowed or 'none'}")
    assert wrong == []


def test_no_module_of_the_package_imports_a_framework():
    """The frameworks build on this package, never the other way round (the backend least of all)."""
    wrong = [
        f"{module}:{i.line} imports {i.target}"
        for module, found in sorted(IMPORTS.items())
        for i in found
        if i.target.partition(".")[0] in FRAMEWORKS
    ]
    assert wrong == []


def test_every_module_says_what_it_is():
    missing = [
        name
        for name, path in package_modules(REPO, PACKAGE).items()
        if not ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        and path.stat().st_size > 0
        and room_of(name) not in RULES_OUTSIDE_DOCSTRINGS
    ]
    assert missing == []


INTEGRATION_SOURCES = [
    path
    for path in sorted((REPO / "integrations").rglob("*.py"))
    if "tests" not in path.relative_to(REPO / "integrations").parts
]


@pytest.mark.parametrize("path", INTEGRATION_SOURCES, ids=lambda p: str(p.relative_to(REPO / "integrations")))
def test_integrations_import_no_engine_library_and_only_the_public_rooms(path):
    names = frozenset(package_modules(REPO, PACKAGE))
    found = imports_of(path.read_text(encoding="utf-8"), path.stem, modules=names)
    assert [i.target for i in found if i.target.partition(".")[0] in ("vllm", "torch")] == []
    ours = {room_of(i.target) for i in found if i.target.partition(".")[0] == PACKAGE}
    assert ours <= INTEGRATIONS_MAY_IMPORT, f"{path.name} imports the rooms {sorted(ours - INTEGRATIONS_MAY_IMPORT)}"
