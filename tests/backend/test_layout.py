"""The backend's layout: stage subpackages, each importing only the stages its docstring names, none importing a
stage that imports it; a handful of top-level modules; every private vLLM name behind ``vllm_compat``; and no module
of the package over the line limit.

A stage is a subpackage of rbln_retrieval/backend/ (its rule in its ``__init__``'s docstring) or a top-level module
of it (its rule in its own docstring; the package's ``__init__`` is the stage "backend"). The rule is one line:

    Stages it may import: config, vllm_compat      (the other stages; "nothing" for none)

Imports are read with ast wherever they stand (module level, inside functions, under TYPE_CHECKING), as
tests/project/test_import_graph.py reads them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from import_graph import find_cycle, import_graph, package_modules

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "rbln_retrieval"
BACKEND = f"{PACKAGE}.backend"
BACKEND_DIR = REPO / PACKAGE / "backend"
TOP_LEVEL_LIMIT = 5  # __init__ and at most four modules beside the stage subpackages
LINE_LIMIT = 450
COMPAT = f"{BACKEND}.vllm_compat"

GRAPH, IMPORTS = import_graph(REPO, PACKAGE)
MODULES = package_modules(REPO, PACKAGE)


def stage_of(module: str) -> str | None:
    """rbln_retrieval.backend.graph.compile -> "graph"; rbln_retrieval.backend.config -> "config";
    rbln_retrieval.backend -> "backend"; a module outside the backend -> None."""
    if module == BACKEND:
        return "backend"
    if not module.startswith(BACKEND + "."):
        return None
    return module[len(BACKEND) + 1 :].split(".")[0]


def stage_rules() -> dict[str, set[str]]:
    """Each stage's allowed stages, read from its docstring."""
    rules = {}
    for module, path in MODULES.items():
        stage = stage_of(module)
        is_stage_file = stage is not None and (
            path.parent == BACKEND_DIR or (path.name == "__init__.py" and path.parent.parent == BACKEND_DIR)
        )
        if not is_stage_file:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        found = re.search(r"^Stages it may import: (.+)$", doc, re.MULTILINE)
        assert found, f"{path.relative_to(REPO)}: no 'Stages it may import:' line in its docstring"
        named = found.group(1).strip()
        rules[stage] = set() if named == "nothing" else {s.strip() for s in named.split(",")}
    return rules


RULES = stage_rules()


def stage_imports() -> dict[str, set[str]]:
    """Stage -> the other stages its modules import."""
    found: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        stage = stage_of(module)
        if stage is None:
            continue
        found.setdefault(stage, set())
        found[stage] |= {t for t in map(stage_of, targets) if t is not None and t != stage}
    return found


def test_the_backend_is_split_into_stages_with_a_handful_of_top_level_modules():
    subpackages = sorted(p.parent.name for p in BACKEND_DIR.glob("*/__init__.py"))
    top_level = sorted(p.name for p in BACKEND_DIR.glob("*.py"))
    assert len(subpackages) >= 4, subpackages
    assert len(top_level) <= TOP_LEVEL_LIMIT, top_level
    assert set(RULES) == {*subpackages, *(Path(n).stem for n in top_level if n != "__init__.py"), "backend"}


def test_every_stage_imports_only_the_stages_its_docstring_names():
    wrong = [
        f"{stage} imports {sorted(targets - RULES[stage])} (it may import: {sorted(RULES[stage]) or 'nothing'})"
        for stage, targets in sorted(stage_imports().items())
        if targets - RULES[stage]
    ]
    assert wrong == []


def test_no_stage_imports_a_stage_that_imports_it():
    for graph in (RULES, stage_imports()):
        cycle = find_cycle(graph)
        assert cycle is None, "stages in a cycle: " + " -> ".join(cycle or [])


def test_the_layout_test_finds_a_stage_importing_one_that_imports_it():
    assert find_cycle({**RULES, "step": {"engine_core"}}) is not None


def _private_vllm_names(source: str) -> list[str]:
    """Every private vLLM module or attribute a source names: ``vllm._x`` imports, ``from vllm.y import _x``, and
    vLLM's C op namespace ``torch.ops._C``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("vllm.") and "._" in a.name]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm":
            module = node.module or ""
            found += [f"{module}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.endswith("__")]
            if "._" in module:
                found.append(module)
        elif isinstance(node, ast.Attribute) and node.attr == "_C" and ast.unparse(node.value).endswith("ops"):
            found.append(ast.unparse(node))
    return found


def test_every_private_vllm_name_is_behind_vllm_compat():
    wrong = {
        module: names
        for module, path in MODULES.items()
        if module != COMPAT and (names := _private_vllm_names(path.read_text(encoding="utf-8")))
    }
    assert wrong == {}
    compat = set(_private_vllm_names(MODULES[COMPAT].read_text(encoding="utf-8")))
    assert {"vllm._custom_ops", "vllm._C_AVX2", "torch.ops._C"} <= compat, "the finder reads vllm_compat's names"


def test_the_private_name_finder_finds_each_kind():
    source = "import vllm._C_AVX2\nfrom vllm import _custom_ops\nfrom vllm.x import _y, __version__\ntorch.ops._C.f()\n"
    assert _private_vllm_names(source) == ["vllm._C_AVX2", "vllm._custom_ops", "vllm.x._y", "torch.ops._C"]


def test_no_module_of_the_package_is_over_the_line_limit():
    long = {
        str(path.relative_to(REPO)): n
        for path in MODULES.values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > LINE_LIMIT
    }
    assert long == {}
