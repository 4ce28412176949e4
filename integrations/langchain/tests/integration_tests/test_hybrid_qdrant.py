"""Hybrid retrieval in Qdrant's local mode: RBLNEmbeddings (dense) and RBLNSparseEmbeddings (bge-m3's lexical
weights) from one tiny random-weight bge-m3 engine, or a tiny SPLADE's sparse vectors beside a tiny BERT
bi-encoder's dense ones, fused by QdrantVectorStore with reciprocal rank fusion.

The weights are random, so relevance is not what is checked: every ranking Qdrant returns must equal the one
computed here from the engine's own vectors (dense cosine, sparse dot product, RRF with Qdrant's constant)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import reference
from langchain_core.documents import Document
from langchain_qdrant import QdrantVectorStore, RetrievalMode
from langchain_qdrant.sparse_embeddings import SparseVector
from qdrant_client.hybrid.fusion import DEFAULT_RANKING_CONSTANT_K

from langchain_rbln import RBLNEmbeddings, RBLNReranker, RBLNSparseEmbeddings

CORPUS = json.loads((Path(__file__).parent / "data" / "corpus.json").read_text(encoding="utf-8"))
TEXTS = list(CORPUS["passages"].values())[:40]
K = 5


@pytest.fixture(scope="module")
def bge_m3(tiny_model, cpu):
    path = tiny_model("bge-m3")
    with RBLNEmbeddings(model=path, **cpu) as dense, RBLNSparseEmbeddings(model=path, **cpu) as sparse:
        yield dense, sparse


@pytest.fixture(scope="module", params=["bge-m3", "splade"])
def hybrid(request, tiny_model, cpu):
    """(dense, sparse) embeddings: bge-m3's two outputs, or SPLADE's sparse vectors beside a bi-encoder's."""
    if request.param == "bge-m3":
        yield request.getfixturevalue("bge_m3")
        return
    dense_model, sparse_model = tiny_model("bert-cls"), tiny_model("splade")
    with RBLNEmbeddings(model=dense_model, **cpu) as dense, RBLNSparseEmbeddings(model=sparse_model, **cpu) as sparse:
        yield dense, sparse


def _sparse_dict(vector: SparseVector) -> dict[int, float]:
    return dict(zip(vector.indices, vector.values))


def _dot(a: dict[int, float], b: dict[int, float]) -> float:
    return sum(w * b[t] for t, w in a.items() if t in b)


def _top(scores: list[float], k: int) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])[:k]


def test_sparse_vectors_are_the_engines_lexical_weights(hybrid):
    dense, sparse = hybrid
    if dense.model == sparse.model:
        assert dense.engine.engine is sparse.engine.engine, "dense and sparse of one model share one engine"
    vectors = sparse.embed_documents(TEXTS[:6])
    assert [_sparse_dict(v) for v in vectors] == sparse.engine.embed(TEXTS[:6], output="sparse")
    assert all(v.indices == sorted(v.indices) and v.indices for v in vectors)
    assert _sparse_dict(sparse.embed_query(TEXTS[0])) == _sparse_dict(vectors[0])


async def test_async_sparse_equals_sync(hybrid):
    _, sparse = hybrid
    assert await sparse.aembed_documents(TEXTS[:4]) == sparse.embed_documents(TEXTS[:4])
    assert await sparse.aembed_query(TEXTS[1]) == sparse.embed_query(TEXTS[1])


def test_a_model_without_a_sparse_head_is_refused_in_one_sentence(minilm, cpu):
    with pytest.raises(ValueError, match=r"has no sparse \(lexical weight\) head \(family bi-encoder\)"):
        RBLNSparseEmbeddings(model=minilm, **cpu)


def test_a_splade_model_asked_for_dense_vectors_says_so(hybrid, cpu):
    """SPLADE refuses output='dense' in one sentence; bge-m3 gives both, its dense vectors the dense side's."""
    dense_side, sparse = hybrid
    with RBLNEmbeddings(model=sparse.model, **cpu) as dense:
        if dense.engine.family.gives_dense:
            assert dense.model == dense_side.model, "only bge-m3 of the two sparse models gives dense vectors"
            assert dense.embed_documents(TEXTS[:3]) == dense_side.embed_documents(TEXTS[:3])
        else:
            with pytest.raises(ValueError, match=r"is a SPLADE model: .* cannot give output='dense'; ask for output"):
                dense.embed_documents(["a"])


@pytest.mark.parametrize("mode", [RetrievalMode.SPARSE, RetrievalMode.HYBRID])
def test_qdrant_local_mode_ranks_as_the_engine_vectors_say(hybrid, mode, tmp_path):
    dense, sparse = hybrid
    store = QdrantVectorStore.from_texts(
        TEXTS,
        dense,
        sparse_embedding=sparse,
        path=str(tmp_path / "qdrant"),
        collection_name="docs",
        retrieval_mode=mode,
    )
    doc_dense = np.asarray(dense.embed_documents(TEXTS))
    doc_sparse = [_sparse_dict(v) for v in sparse.embed_documents(TEXTS)]
    for query in (TEXTS[3], "Which passage talks about the weather in spring?"):
        dense_scores = list(doc_dense @ np.asarray(dense.embed_query(query)))
        q = _sparse_dict(sparse.embed_query(query))
        sparse_scores = [_dot(q, d) for d in doc_sparse]
        found = store.similarity_search_with_score(query, k=K)
        if mode == RetrievalMode.SPARSE:
            expected = [(i, sparse_scores[i]) for i in _top(sparse_scores, K)]
        else:  # RRF over each side's top K, with Qdrant's ranking constant
            fused: dict[int, float] = {}
            for ranking in (_top(dense_scores, K), _top(sparse_scores, K)):
                for position, i in enumerate(ranking):
                    fused[i] = fused.get(i, 0.0) + 1 / (position + DEFAULT_RANKING_CONSTANT_K)
            expected = sorted(fused.items(), key=lambda item: -item[1])[:K]
        assert [doc.page_content for doc, _ in found] == [TEXTS[i] for i, _ in expected]
        assert [score for _, score in found] == pytest.approx([s for _, s in expected], rel=1e-5)
    if mode == RetrievalMode.HYBRID:  # a document's own text is first on both sides, so first after fusion
        assert store.similarity_search(TEXTS[3], k=1)[0].page_content == TEXTS[3]
    store.client.close()


def test_reranker_with_late_interaction_ranks_by_maxsim(bge_m3, tiny_model, minilm, cpu):
    dense, _ = bge_m3
    with RBLNReranker(model=tiny_model("bge-m3"), late_interaction=True, top_n=3, **cpu) as reranker:
        ranked = reranker.rerank(TEXTS[1:9], TEXTS[0], top_n=3)
    scores = dense.engine.score(TEXTS[0], TEXTS[1:9], output="multi_vector")
    assert [r["index"] for r in ranked] == _top(scores, 3)
    assert [r["relevance_score"] for r in ranked] == pytest.approx(sorted(scores, reverse=True)[:3], abs=1e-6)
    with pytest.raises(ValueError, match=r"has no multi-vector \(late-interaction\) head \(family bi-encoder\)"):
        RBLNReranker(model=minilm, late_interaction=True, **cpu)


def test_reranker_on_a_colbert_model_ranks_by_maxsim_without_flags(tiny_model, cpu):
    """A ColBERT checkpoint has token vectors only: RBLNReranker scores by MaxSim without late_interaction=True,
    as the plain-torch ColBERT reference does (sum over query tokens of the best document-token dot product)."""
    path = str(tiny_model("colbert"))
    (query,) = reference.colbert(path, [TEXTS[0]], max_length=512)
    expected = [reference.colbert_maxsim(query, d) for d in reference.colbert(path, TEXTS[1:9], max_length=512)]
    with RBLNReranker(model=path, top_n=3, **cpu) as reranker:
        ranked = reranker.rerank(TEXTS[1:9], TEXTS[0])
        compressed = reranker.compress_documents([Document(page_content=t) for t in TEXTS[1:9]], TEXTS[0])
        reranker.late_interaction = True  # the flag bge-m3 needs changes nothing here
        flagged = reranker.rerank(TEXTS[1:9], TEXTS[0])
    assert [r["index"] for r in ranked] == _top(expected, len(expected))
    assert [r["relevance_score"] for r in ranked] == pytest.approx(sorted(expected, reverse=True), abs=1e-5)
    assert [d.page_content for d in compressed] == [TEXTS[1 + i] for i in _top(expected, 3)]
    assert flagged == ranked
