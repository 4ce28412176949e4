"""docs/reliability.md rows that apply to the framework classes, each row once over every class it applies to: one
result per input in input order, top_n bounds with each input at most once, NaN or infinite score_threshold refused
at construction, and an API key that never shows. All on the session's shared MiniLM engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
from http_fakes import API_KEY, assert_api_key_hidden
from langchain_core.documents import Document
from llama_index.core.schema import NodeWithScore, TextNode

from langchain_rbln import RBLNEmbeddings, RBLNReranker
from llama_index.embeddings.rbln import RBLNEmbedding
from llama_index.postprocessor.rbln_rerank import RBLNReranker as NodeReranker

QUERY = "Which planet is red?"
TEXTS = ["Mars looks red.", "", "Jupiter is big.", "Mars looks red.", "火星は赤い。", "Venus is hot.", "  "]


def _nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=str(i), text=t), score=1.0) for i, t in enumerate(TEXTS)]


def _documents() -> list[Document]:
    return [Document(page_content=t, id=str(i)) for i, t in enumerate(TEXTS)]


# (make(model, **fields), embed(object, texts)); the LlamaIndex class in batches of 3, several per call.
EMBEDDERS = {
    "langchain": (lambda model, **kw: RBLNEmbeddings(model=model, **kw), lambda o, texts: o.embed_documents(texts)),
    "llama-index": (
        lambda model, **kw: RBLNEmbedding(model_name=model, embed_batch_size=3, **kw),
        lambda o, texts: o.get_text_embedding_batch(texts),
    ),
}
# (make(model, **fields), rerank(object) -> the ids it kept)
RERANKERS = {
    "langchain": (
        lambda model, **kw: RBLNReranker(model=model, **kw),
        lambda o: [d.id for d in o.compress_documents(_documents(), QUERY)],
    ),
    "llama-index": (
        lambda model, **kw: NodeReranker(model=str(model), batch_size=3, **kw),
        lambda o: [n.node.node_id for n in o.postprocess_nodes(_nodes(), query_str=QUERY)],
    ),
}


@pytest.mark.parametrize("make, embed", EMBEDDERS.values(), ids=EMBEDDERS)
def test_one_vector_per_text_in_input_order(minilm, minilm_engine, make, embed, cpu):
    embedder = make(minilm, **cpu)
    vectors = np.array(embed(embedder, TEXTS))
    assert vectors.shape == (len(TEXTS), 384)
    reversed_vectors = np.array(embed(embedder, TEXTS[::-1]))
    np.testing.assert_allclose(reversed_vectors[::-1], vectors, atol=1e-5)
    np.testing.assert_allclose(vectors[3], vectors[0], atol=1e-6)


@pytest.mark.parametrize("top_n, expected", [(-1, 0), (0, 0), (2, 2), (100, len(TEXTS))])
@pytest.mark.parametrize("make, rerank", RERANKERS.values(), ids=RERANKERS)
def test_top_n_bounds_keep_each_input_at_most_once(minilm, minilm_engine, make, rerank, top_n, expected, cpu):
    kept = rerank(make(minilm, top_n=top_n, **cpu))
    assert len(kept) == expected
    assert len(set(kept)) == expected, "each input at most once"


@pytest.mark.parametrize("threshold", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("make", [make for make, _ in RERANKERS.values()], ids=RERANKERS)
def test_nan_or_infinite_score_threshold_is_rejected_at_construction(minilm, make, threshold, cpu):
    with pytest.raises(ValueError, match="score_threshold"):
        make(minilm, score_threshold=threshold, **cpu)


USES = {
    "langchain-embeddings": (EMBEDDERS["langchain"][0], lambda o: o.embed_documents(["x"])),
    "langchain-reranker": (
        RERANKERS["langchain"][0],
        lambda o: o.compress_documents([Document(page_content="x")], QUERY),
    ),
    "llama-index-embedding": (EMBEDDERS["llama-index"][0], lambda o: o.get_text_embedding("x")),
    "llama-index-reranker": (RERANKERS["llama-index"][0], lambda o: o.postprocess_nodes(_nodes(), query_str=QUERY)),
}


@pytest.mark.parametrize("make, use", USES.values(), ids=USES)
def test_api_key_never_appears_in_repr_logs_or_errors(minilm, caplog, make, use):
    assert_api_key_hidden(lambda url: make(minilm, base_url=url, api_key=API_KEY, timeout=2), use, caplog)
