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
from import_graph import find_cycle, import_graph, imports_of, package_modules

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "rbln_retrieval"
ENGINE_LIBRARIES = ("vllm", "torch", "transformers")
FRAMEWORKS = ("langchain", "langchain_core", "langchain_rbln", "llama_index")

# Rules of the rooms whose files this branch may not edit beyond their import lines: (may import, engine libraries).
RULES_OUTSIDE_DOCSTRINGS = {
    "ray": ("local, server, backend", "vllm (deferred)"),
}
# What the framework integrations may import of this package: the public API and the rooms made for them.
INTEGRATIONS_MAY_IMPORT = {"rbln_retrieval", "frameworks", "text", "results", "models"}


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
