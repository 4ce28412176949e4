"""docs/reliability.md rows that apply to RBLNEmbedding: one vector per text in input order, and an API key that
never shows."""

from __future__ import annotations

import numpy as np
from http_fakes import API_KEY, assert_api_key_hidden

from llama_index.embeddings.rbln import RBLNEmbedding

TEXTS = ["Mars looks red.", "", "Jupiter is big.", "Mars looks red.", "火星は赤い。", "Venus is hot.", "  "]


def test_text_embeddings_one_per_text_in_order(minilm, cpu):
    embedding = RBLNEmbedding(model_name=minilm, embed_batch_size=3, **cpu)  # several batches per call
    vectors = np.array(embedding.get_text_embedding_batch(TEXTS))
    assert vectors.shape == (len(TEXTS), 384)
    reversed_vectors = np.array(embedding.get_text_embedding_batch(TEXTS[::-1]))
    np.testing.assert_allclose(reversed_vectors[::-1], vectors, atol=1e-5)
    np.testing.assert_allclose(vectors[3], vectors[0], atol=1e-6)


def test_api_key_never_appears_in_repr_logs_or_errors(minilm, caplog):
    assert_api_key_hidden(
        lambda url: RBLNEmbedding(model_name=minilm, base_url=url, api_key=API_KEY, timeout=2),
        lambda obj: obj.get_text_embedding("x"),
        caplog,
    )
