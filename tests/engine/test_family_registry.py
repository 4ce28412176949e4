"""The family registry (rbln_retrieval/models/specs/): every family's knowledge lives in its spec, and the shipped
code outside the specs never names a family or a score method. Engine-free: detection reads config files only."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from model_builders import minilm_path
from multimodal_builders import build_clip, build_colpali, build_siglip

from rbln_retrieval import detect_family
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.specs import SPECS, SPECS_BY_NAME, FamilyName
from rbln_retrieval.models.stages import STAGE_OF, STAGES

REPO = Path(__file__).resolve().parents[2]
SHIPPED = (REPO / "rbln_retrieval", REPO / "integrations")
SPECS_DIR = REPO / "rbln_retrieval" / "models" / "specs"
FAMILY_NAMES = frozenset(get_args(FamilyName))
# Score methods by the names they once had: a family's Scoring is data the router reads, never a named mode.
SCORE_METHODS = frozenset({"cosine", "sparse-dot", "sparse_dot", "maxsim", "pairs", "template"})
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


# Any spelling of a family, in code or in comments. Not one: a Hugging Face id ("org/name", a default model) and
# numpy's clip.
FAMILY_WORDS = re.compile(r"qwen|splade|colbert|bge.?m3|colpali|siglip|\bclip\b|gemma|nomic", re.I)
NOT_A_FAMILY = re.compile(r"[\w.-]+/[\w.-]+|\bnp\.clip\(")
# Where a family may be named: its spec, and the bundled backend's architecture modules, each of which is one
# architecture's graph fixed for vLLM (as vLLM's own model files are) and is reached by the runner through a hook or
# a capability, never by name. The rest of the package names no family, even in a comment.
NAMED_IN = (SPECS_DIR, REPO / "rbln_retrieval" / "backend" / "graph" / "architectures")


def family_lines(path: Path) -> list[str]:
    return [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FAMILY_WORDS.search(NOT_A_FAMILY.sub("", line))
    ]


def nameless_files() -> list[Path]:
    return [
        path
        for path in sorted((REPO / "rbln_retrieval").rglob("*.py"))
        if not any(path.is_relative_to(room) for room in NAMED_IN)
    ]


def test_the_package_names_no_family_outside_the_specs_and_the_architectures():
    files = nameless_files()
    assert len(files) > 100
    named = [line for path in files for line in family_lines(path)]
    assert not named, "ask the family's spec (models/specs/) instead of naming the family:\n" + "\n".join(named)


def test_the_word_scan_catches_a_planted_family_and_passes_hub_ids_and_numpy():
    files, graph = nameless_files(), REPO / "rbln_retrieval" / "backend" / "graph"
    assert graph / "host_kernels.py" in files and graph / "architectures" / "colpali.py" not in files
    assert FAMILY_WORDS.search(NOT_A_FAMILY.sub("", "# Qwen3's per-head norms"))
    assert FAMILY_WORDS.search(NOT_A_FAMILY.sub("", "images (CLIP, SigLIP)"))
    assert not FAMILY_WORDS.search(NOT_A_FAMILY.sub("", 'DEFAULT = "BAAI/bge-m3"; x = np.clip(y, 0, 255)'))


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


PLAIN_MLP = {"bi-encoder", "cross-encoder", "bge-m3", "colbert", "splade"}


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.name)
def test_every_spec_is_detected_from_its_test_model(spec, tiny_models, tmp_path):
    make = BUILT_OTHERWISE.get(spec.name)
    path = make(tiny_models, tmp_path) if make else tiny_models[spec.name]
    family = detect_family(path)
    assert family.name == spec.name
    assert family.spec is spec
    assert family.pooling_task == spec.pooling_task
    assert family.gives_dense == ("dense" in spec.outputs)
    # The step cost's MLP: two matrices for the BERT-like encoders, three (gated) for every other test model.
    assert family.graph.gated_mlp == (spec.name not in PLAIN_MLP)
    # A family is its stages in data-path order, and a server's flat description of it reads back into an equal one.
    assert [type(stage) for stage in family.stages] == list(STAGES.values())
    assert [getattr(family, name) for name in STAGES] == list(family.stages)
    described = json.loads(json.dumps(family.fields()))
    assert ModelFamily.build(**described) == family


def test_each_field_of_a_preset_lands_in_exactly_one_stage():
    """A flat preset or description is sorted by field name, so no two stages may hold the same name; a field no
    stage holds is refused naming it (a server's description from another version reads as that, not silently)."""
    names = [f.name for stage in STAGES.values() for f in dataclasses.fields(stage)]
    assert len(names) == len(set(names)) == len(STAGE_OF)
    with pytest.raises(TypeError, match="no stage of a model family holds colour"):
        ModelFamily.build("bi-encoder", architecture="BertModel", hidden_size=8, max_length=16, colour="red")
    family = ModelFamily.build("bi-encoder", architecture="BertModel", hidden_size=8, max_length=16)
    changed = family.replace(max_length=8, query_prompt="q: ")
    assert (changed.tokens.max_length, changed.prompt.query_prompt, changed.pool) == (8, "q: ", family.pool)


def test_a_flat_read_still_answers_for_one_release_with_a_warning_naming_the_stage(tiny_models):
    """Users' code reads ``engine.family.hidden_size``: it keeps working, warning where the field lives now."""
    family = detect_family(tiny_models["bert-cls"])
    with pytest.warns(DeprecationWarning, match=r"ModelFamily\.hidden_size is deprecated; read family\.pool\.hidden"):
        assert family.hidden_size == family.pool.hidden_size
    with pytest.raises(AttributeError, match="has no attribute 'colour'"):
        family.colour  # noqa: B018
