"""One vocabulary of engine options: each declared once (rbln_retrieval/engines/options.py) with its type, default and
help, and everything that names one derived from that declaration: ``EngineOptions``, the framework objects'
settings, the CLI's flags (their choices, defaults and help) and the options table of docs/getting-started.md. Each
test fails when one of them drifts from the declaration."""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from rbln_retrieval import PoolingEngine, cli
from rbln_retrieval.engines.options import ComputeOptions, EngineOptions, SourceOptions, local_model
from rbln_retrieval.frameworks.settings import ENGINE_SETTINGS, EngineSettings

REPO = Path(__file__).resolve().parents[2]
DECLARED = {**SourceOptions.model_fields, **EngineOptions.model_fields}


def options_table() -> str:
    """The docs' table of EngineOptions, as docs/getting-started.md must hold it."""
    rows = ["| option | default | what it chooses |", "| --- | --- | --- |"]
    for name, field in EngineOptions.model_fields.items():
        default = repr(field.get_default(call_default_factory=True)).replace("'", '"')
        rows.append(f"| `{name}` | `{default}` | {' '.join((field.description or '').split())} |")
    return "\n".join(rows)


def flags() -> list[tuple[str, argparse.Action]]:
    """(command, action) of every CLI flag named after a declared option."""
    _, commands = cli._parser()
    return [
        (command, action)
        for command, parser in commands.items()
        for action in parser._actions
        if action.dest in DECLARED and action.option_strings
    ]


def test_every_option_has_a_type_a_default_and_help():
    for name, field in DECLARED.items():
        assert field.description and field.description.strip().endswith("."), f"{name} has no help sentence"
        assert field.annotation is not None, name


def test_the_framework_settings_inherit_the_declarations():
    for name, field in {**SourceOptions.model_fields, **ComputeOptions.model_fields}.items():
        mine = EngineSettings.model_fields[name]
        assert (mine.annotation, mine.default, mine.description) == (field.annotation, field.default, field.description)
        assert name in ENGINE_SETTINGS  # an engine option selects the shared engine
    assert ENGINE_SETTINGS - set(DECLARED) == {"hf_token", "base_url", "api_key"}


def test_the_cli_flags_are_made_from_the_declarations():
    found = flags()
    assert {action.dest for _, action in found} >= {
        "device",
        "dtype",
        "runner",
        "max_length",
        "trust_remote_code",
        "revision",
        "cache_folder",
    }
    for command, action in found:
        field = DECLARED[action.dest]
        where = f"{command} {action.option_strings[0]}"
        help_text = " ".join((field.description or "").replace("`", "").split())
        assert action.help is not None and action.help.replace("%%", "%").startswith(help_text), where
        if field.annotation is bool:
            assert isinstance(action, argparse._StoreTrueAction), where
            continue
        expected = get_args(field.annotation) if get_origin(field.annotation) is Literal else None
        assert action.choices == expected, where
        from_env = command == "serve" and action.dest in cli.SERVE_ENV
        assert action.default == (None if from_env else field.default), where


def test_the_docs_table_is_the_declarations():
    text = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert options_table() in text, "docs/getting-started.md's options table differs from EngineOptions:\n" + (
        options_table()
    )


@pytest.mark.parametrize("values", ['"auto", "float32", "bfloat16"', '"auto", "rbln", "cpu"', '"bundled", "stock"'])
def test_each_choice_list_is_written_once_in_the_package(values):
    spelled = re.compile(re.escape(values).replace('\\"', "[\"']"))
    where = [
        f"{path.relative_to(REPO)}:{n}"
        for path in sorted((REPO / "rbln_retrieval").rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if spelled.search(line)
    ]
    assert where == ["rbln_retrieval/engines/options.py:" + where[0].rpartition(":")[2]], where


# Where EngineOptions are built and families read: each entry point once, handed down typed from there.
ENTRY_POINTS = {
    "EngineOptions": {
        "rbln_retrieval/frameworks/connect.py": 1,  # get_engine: the framework objects' entry
        "rbln_retrieval/local/engine.py": 2,  # PoolingEngine(model, **options) and PoolingEngine.shared
        "rbln_retrieval/remote/client.py": 1,  # RemoteEngine(model, **options)
        "rbln_retrieval/server/serve.py": 1,  # server_setup
    },
    "detect_family": {
        "rbln_retrieval/engines/options.py": 1,  # local_model, which every local entry point calls
        "rbln_retrieval/remote/served_model.py": 1,  # a remote model whose server names no family
    },
}


def test_options_are_built_and_families_read_only_at_the_entry_points():
    calls: dict[str, dict[str, int]] = {name: {} for name in ENTRY_POINTS}
    for path in sorted([*(REPO / "rbln_retrieval").rglob("*.py"), *(REPO / "integrations").rglob("*.py")]):
        if "tests" in path.relative_to(REPO).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ENTRY_POINTS:
                made = calls[node.func.id]
                made[str(path.relative_to(REPO))] = made.get(str(path.relative_to(REPO)), 0) + 1
    assert calls == ENTRY_POINTS


def test_a_local_model_carries_its_options(minilm):
    resolved = local_model(minilm, EngineOptions(device="cpu"))
    assert resolved.family.name == "bi-encoder" and resolved.options.device == "cpu"
    with pytest.raises(ValueError, match=r"^dtype, revision cannot be given beside a LocalModel, which carries"):
        PoolingEngine(resolved, dtype="float32", revision="main")
