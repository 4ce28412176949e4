"""Fixtures shared by the tests of both LlamaIndex distributions: models are built once per session and
engines are shared (an engine start costs ~20 s on this machine), and the labeled corpus in testdata/."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from llama_index.core.schema import TextNode  # noqa: E402
from rbln_retrieval.testing import BUILDERS, minilm_path  # noqa: E402

CORPUS = Path(__file__).parent / "testdata" / "passages.json"


@pytest.fixture(scope="session")
def cpu() -> dict[str, Any]:
    """Engine options for every object in these tests: the CPU in float32, so results compare exactly."""
    return {"device": "cpu", "dtype": "float32"}


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Callable[[str], Path]:
    """tiny_model(name) builds rbln_retrieval.testing.BUILDERS[name] once per session and returns its path."""
    root = tmp_path_factory.mktemp("tiny-models")

    def build(name: str) -> Path:
        path = root / name
        if not (path / "config.json").exists():
            BUILDERS[name](path)
        return path

    return build


@pytest.fixture(scope="session")
def corpus() -> dict[str, Any]:
    return json.loads(CORPUS.read_text(encoding="utf-8"))


@pytest.fixture
def corpus_nodes(corpus) -> list[TextNode]:
    """One node per passage, labeled in metadata; the label is kept out of the embedded and LLM text."""
    return [
        TextNode(
            id_=p["id"],
            text=p["text"],
            metadata={"label": p["id"]},
            excluded_embed_metadata_keys=["label"],
            excluded_llm_metadata_keys=["label"],
        )
        for p in corpus["passages"]
    ]
