"""The family registry (rbln_retrieval/models/specs/): every family's knowledge lives in its spec, and the shipped
code outside the specs never names a family or a score method. Engine-free: detection reads config files only."""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from model_builders import minilm_path
from multimodal_builders import build_clip, build_colpali, build_siglip

from rbln_retrieval import detect_family
from rbln_retrieval.models.spec import Scoring
from rbln_retrieval.models.specs import SPECS, SPECS_BY_NAME, FamilyName

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (REPO / "rbln_retrieval", REPO / "integrations")
SPECS_DIR = REPO / "rbln_retrieval" / "models" / "specs"
FAMILY_NAMES = frozenset(get_args(FamilyName))
# Score methods by their names, and the strings that once stood for them.
SCORE_METHODS = frozenset(m.name.lower() for m in Scoring) | {"cosine", "sparse-dot", "maxsim"}
BANNED = FAMILY_NAMES | SCORE_METHODS


def _is_family_name(node: ast.expr) -> bool:
    """``<...>.family.name`` or ``family.name``: a family's name, whatever it is compared with."""
    if not (isinstance(node, ast.Attribute) and node.attr == "name"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "family") or (
        isinstance(owner, ast.Attribute) and owner.attr == "family"
    )


def naming_offences(source: str) -> list[tuple[int, str]]:
    """(line, what) for each string constant that is a family or score-method name, and each comparison of a
    family's name with a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BANNED:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_family_name(o) for o in operands) and any(
                isinstance(o, ast.Constant) and isinstance(o.value, str) for o in operands
            ):
                found.append((node.lineno, "a family's name compared with a string"))
    return sorted(found)


def shipped_files() -> list[Path]:
    files = []
    for root in SHIPPED:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(REPO).parts
            if path.is_relative_to(SPECS_DIR) or "tests" in parts:
                continue
            files.append(path)
    return files


def test_no_family_or_score_method_is_named_outside_the_specs():
    offences = [
        f"{path.relative_to(REPO)}:{line}: {what}"
        for path in shipped_files()
        for line, what in naming_offences(path.read_text(encoding="utf-8"))
    ]
    assert not offences, "ask the family's spec instead of naming the family:\n" + "\n".join(offences)


def test_the_scan_catches_a_planted_name():
    planted = 'def f(family):\n    if family.name == "splade":\n        return 1\n'
    assert naming_offences(planted) == [(2, "'splade'"), (2, "a family's name compared with a string")]
    assert naming_offences("def f(self):\n    return self.family.name != 'a-new-family'\n") == [
        (2, "a family's name compared with a string")
    ]
    assert naming_offences("method = 'cosine'\n") == [(1, "'cosine'")]
    assert len(shipped_files()) > 50  # the scan reads the package and the integrations


# Any spelling of a family, in code or in comments; a Hugging Face id ("org/name", a default model) is not one.
FAMILY_WORDS = re.compile(r"qwen|splade|colbert|bge.?m3|colpali|siglip|\bclip\b|gemma|nomic", re.I)
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
# The rooms that ask the spec and name no family even in a comment; the rest of the package (outside models/specs/)
# is held to at most FAMILY_LINES_ELSEWHERE lines that name one, so the count can only fall.
NAMELESS = ("engines", "text", "models/*.py", "local/engine.py", "local/pair_calls.py", "remote/client.py")
FAMILY_LINES_ELSEWHERE = 104


def family_lines(path: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FAMILY_WORDS.search(HUB_ID.sub("", line))
    ]


def test_the_nameless_rooms_name_no_family_and_the_rest_name_fewer():
    package = REPO / "rbln_retrieval"
    nameless = {path for pattern in NAMELESS for path in package.glob(pattern if "." in pattern else f"{pattern}/*.py")}
    assert len(nameless) > 20
    named = [line for path in sorted(nameless) for line in family_lines(path)]
    assert not named, "ask the family's spec (models/specs/) instead of naming the family:\n" + "\n".join(named)
    elsewhere = [
        line
        for path in sorted(package.rglob("*.py"))
        if path not in nameless and not path.is_relative_to(SPECS_DIR)
        for line in family_lines(path)
    ]
    assert len(elsewhere) <= FAMILY_LINES_ELSEWHERE, "\n".join(elsewhere)


def test_every_family_name_has_one_spec():
    assert [spec.name for spec in SPECS] == list(SPECS_BY_NAME)
    assert set(SPECS_BY_NAME) == FAMILY_NAMES


# The test model of each family: tests/model_builders.py's BUILDERS by family name, else these.
BUILT_OTHERWISE: dict[str, Callable[[Any, Path], Path]] = {
    "bi-encoder": lambda models, root: minilm_path(),
    "cross-encoder": lambda models, root: models["bert-cross-encoder"],
    "clip": lambda models, root: build_clip(root / "clip"),
    "siglip": lambda models, root: build_siglip(root / "siglip"),
    "colpali": lambda models, root: build_colpali(root / "colpali"),
}


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_every_spec_is_detected_from_its_test_model(spec, tiny_models, tmp_path):
    make = BUILT_OTHERWISE.get(spec.name)
    path = make(tiny_models, tmp_path) if make else tiny_models[spec.name]
    family = detect_family(path)
    assert family.name == spec.name
    assert family.spec is spec
    assert family.pooling_task == spec.pooling_task
    assert family.gives_dense == ("dense" in spec.outputs)
