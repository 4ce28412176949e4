"""docs/reliability.md rows that apply to RBLNEmbeddings and RBLNReranker: one result per input in input order,
top_n bounds, NaN/infinite score_threshold, and an API key that never shows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from http_fakes import API_KEY, assert_api_key_hidden
from langchain_core.documents import Document

from langchain_rbln import RBLNEmbeddings, RBLNReranker

QUERY = "Which planet is red?"
TEXTS = ["Mars looks red.", "", "Jupiter is big.", "Mars looks red.", "火星は赤い。", "Venus is hot.", "  "]


def test_embed_documents_returns_one_vector_per_text_in_order(minilm_embeddings):
    vectors = np.array(minilm_embeddings.embed_documents(TEXTS))
    assert vectors.shape == (len(TEXTS), 384)
    reversed_vectors = np.array(minilm_embeddings.embed_documents(TEXTS[::-1]))
    np.testing.assert_allclose(reversed_vectors[::-1], vectors, atol=1e-5)
    np.testing.assert_allclose(vectors[3], vectors[0], atol=1e-6)


@pytest.mark.parametrize("top_n, expected", [(-1, 0), (0, 0), (2, 2), (100, len(TEXTS))])
def test_rerank_top_n_bounds(minilm, cpu, top_n, expected):
    reranker = RBLNReranker(model=minilm, top_n=top_n, **cpu)
    kept = reranker.compress_documents([Document(page_content=t, id=str(i)) for i, t in enumerate(TEXTS)], QUERY)
    assert len(kept) == expected
    assert len({d.id for d in kept}) == expected, "each input at most once"


@pytest.mark.parametrize("threshold", [math.nan, math.inf, -math.inf])
def test_nan_or_infinite_score_threshold_is_rejected_at_construction(minilm, cpu, threshold):
    with pytest.raises(ValueError, match="score_threshold"):
        RBLNReranker(model=minilm, score_threshold=threshold, **cpu)


@pytest.mark.parametrize(
    "cls, use",
    [
        (RBLNEmbeddings, lambda obj: obj.embed_documents(["x"])),
        (RBLNReranker, lambda obj: obj.compress_documents([Document(page_content="x")], QUERY)),
    ],
)
def test_api_key_never_appears_in_repr_logs_or_errors(minilm, caplog, cls, use):
    assert_api_key_hidden(lambda url: cls(model=minilm, base_url=url, api_key=API_KEY, timeout=2), use, caplog)
