"""Session-wide models and objects: an engine start costs ~20 s here, and objects with equal settings share one
engine through rbln_retrieval.get_engine, so every test below reuses a handful of engines (every object takes the
session's `cpu` options, from the repository's conftest.py)."""

from __future__ import annotations

import pytest

from langchain_rbln import RBLNEmbeddings, RBLNReranker


@pytest.fixture(scope="session")
def minilm_embeddings(minilm, cpu) -> RBLNEmbeddings:
    return RBLNEmbeddings(model=minilm, **cpu)


@pytest.fixture(scope="session")
def cross_encoder_reranker(tiny_model, cpu) -> RBLNReranker:
    return RBLNReranker(model=tiny_model("bert-cross-encoder"), top_n=None, **cpu)
