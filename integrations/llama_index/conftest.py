"""The labeled corpus in testdata/, shared by the tests of both LlamaIndex distributions (model fixtures are in
the repository's root conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llama_index.core.schema import TextNode

CORPUS = Path(__file__).parent / "testdata" / "passages.json"


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
