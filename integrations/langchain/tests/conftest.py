"""Session-wide models and objects: an engine start costs ~20 s here, and objects with equal settings share one
engine through rbln_retrieval.get_engine, so every test below reuses a handful of engines."""

from __future__ import annotations

from typing import Any

import pytest

from langchain_rbln import RBLNEmbeddings, RBLNReranker

# Every test object uses these, so all of them land on the same few shared engines.
CPU: dict[str, Any] = {"device": "cpu", "dtype": "float32"}


@pytest.fixture(scope="session")
def minilm_embeddings(minilm) -> RBLNEmbeddings:
    return RBLNEmbeddings(model=minilm, **CPU)


@pytest.fixture(scope="session")
def cross_encoder_reranker(tiny_model) -> RBLNReranker:
    return RBLNReranker(model=tiny_model("bert-cross-encoder"), top_n=None, **CPU)
