"""LangChain's standard embeddings integration tests, on real all-MiniLM-L6-v2 and on a tiny Qwen3-Embedding."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import EmbeddingsIntegrationTests
from model_builders import minilm_path

from langchain_rbln import RBLNEmbeddings


class TestRBLNEmbeddingsMiniLM(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[RBLNEmbeddings]:
        return RBLNEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"model": str(minilm_path()), "device": "cpu", "dtype": "float32"}


class TestRBLNEmbeddingsQwen3(EmbeddingsIntegrationTests):
    """Qwen3-Embedding: last-token pooling and a query prompt, so embed_query differs from embed_documents."""

    @property
    def embeddings_class(self) -> type[RBLNEmbeddings]:
        return RBLNEmbeddings

    @pytest.fixture
    def model(self, tiny_model, cpu) -> RBLNEmbeddings:
        return RBLNEmbeddings(model=tiny_model("qwen3-embedding"), **cpu)
