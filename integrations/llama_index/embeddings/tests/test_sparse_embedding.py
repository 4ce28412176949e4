"""RBLNSparseEmbedding (LlamaIndex's BaseSparseEmbedding) on a tiny random-weight bge-m3 and SPLADE, and its vectors in
Qdrant's local mode: Qdrant's sparse ranking must be the engine's own dot products."""

from __future__ import annotations

import pytest
from llama_index.core.base.embeddings.base_sparse import BaseSparseEmbedding
from qdrant_client import QdrantClient, models

from llama_index.embeddings.rbln import RBLNEmbedding, RBLNSparseEmbedding

TEXTS = [
    "The cat sat on the mat.",
    "Qdrant keeps dense and sparse vectors side by side.",
    "An NPU runs neural networks.",
    "Paris is the capital of France.",
    "Rivers flow into the sea, the sea into the ocean.",
]


@pytest.fixture(scope="module", params=["bge-m3", "splade"])
def sparse(request, tiny_model, cpu):
    with RBLNSparseEmbedding(model_name=tiny_model(request.param), **cpu) as embedding:
        yield embedding


def test_class_hierarchy_and_name():
    assert BaseSparseEmbedding in RBLNSparseEmbedding.__mro__
    assert RBLNSparseEmbedding.class_name() == "RBLNSparseEmbedding"


def test_texts_and_queries_are_the_engines_lexical_weights(sparse):
    expected = sparse._engine.embed(TEXTS, output="sparse")
    assert sparse.get_text_embedding_batch(TEXTS) == expected
    assert sparse.get_text_embedding(TEXTS[2]) == expected[2]
    assert sparse.get_query_embedding(TEXTS[1]) == expected[1]
    assert all(isinstance(k, int) and v > 0 for d in expected for k, v in d.items())


async def test_async_equals_sync(sparse):
    assert await sparse.aget_text_embedding_batch(TEXTS) == sparse.get_text_embedding_batch(TEXTS)
    assert await sparse.aget_query_embedding(TEXTS[0]) == sparse.get_query_embedding(TEXTS[0])


def test_shares_the_engine_with_the_dense_embedding(sparse, cpu):
    with RBLNEmbedding(model_name=sparse.model_name, **cpu) as dense:
        assert dense._engine.engine is sparse._engine.engine
        if not dense._engine.family.gives_dense:  # SPLADE: sparse vectors only, refused in one sentence
            with pytest.raises(ValueError, match=r"is a SPLADE model: .* cannot give output='dense'; ask for"):
                dense.get_text_embedding("a")


def test_a_model_without_a_sparse_head_is_refused_in_one_sentence(minilm, cpu):
    with pytest.raises(ValueError, match=r"has no sparse \(lexical weight\) head \(family bi-encoder\)"):
        RBLNSparseEmbedding(model_name=minilm, **cpu)


def test_qdrant_sparse_search_ranks_by_the_engines_weights(sparse):
    client = QdrantClient(":memory:")
    client.create_collection("docs", vectors_config={}, sparse_vectors_config={"text": models.SparseVectorParams()})
    docs = sparse.get_text_embedding_batch(TEXTS)
    client.upsert(
        "docs",
        [
            models.PointStruct(id=i, vector={"text": models.SparseVector(indices=list(d), values=list(d.values()))})
            for i, d in enumerate(docs)
        ],
    )
    query = sparse.get_query_embedding("the sea and the cat")
    found = client.query_points(
        "docs", query=models.SparseVector(indices=list(query), values=list(query.values())), using="text", limit=3
    ).points
    dots = [sum(w * d.get(t, 0.0) for t, w in query.items()) for d in docs]
    expected = sorted((i for i in range(len(docs)) if dots[i] > 0), key=lambda i: -dots[i])[:3]
    assert [p.id for p in found] == expected
    assert [p.score for p in found] == pytest.approx([dots[i] for i in expected], rel=1e-5)
    client.close()
