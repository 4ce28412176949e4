"""docs/reliability.md rows that apply to RBLNEmbedding: one vector per text in input order, and an API key that
never shows."""

from __future__ import annotations

import logging
import traceback

import numpy as np
import pytest
from http_fakes import API_KEY, assert_api_key_hidden
from model_builders import HUB_MINILM, HUB_TINY_RERANKER

from llama_index.embeddings.rbln import RBLNEmbedding
from rbln_retrieval import ModelNotFoundError, PoolingEngine

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


def test_a_hugging_face_id_works_like_its_directory_and_the_token_never_shows(hub_cache, minilm, cpu, caplog):
    caplog.set_level(logging.DEBUG)
    token = "hf_llamaindex_secret_8a2c"
    by_id = RBLNEmbedding(model_name=f"{HUB_MINILM}@main", cache_folder=str(hub_cache), hf_token=token, **cpu)
    by_path = RBLNEmbedding(model_name=minilm, **cpu)
    np.testing.assert_allclose(
        by_id.get_text_embedding_batch(TEXTS), by_path.get_text_embedding_batch(TEXTS), atol=1e-5
    )
    assert by_id._engine.engine is PoolingEngine.shared(HUB_MINILM, cache_folder=hub_cache, **cpu).engine
    with pytest.raises(ValueError, match="is a reranker"):  # found from the id's configs, before any engine
        RBLNEmbedding(model_name=HUB_TINY_RERANKER, cache_folder=str(hub_cache), **cpu)
    with pytest.raises(ModelNotFoundError, match="no-such-org/model is not in the Hugging Face cache") as raised:
        RBLNEmbedding(model_name="no-such-org/model", cache_folder=str(hub_cache), hf_token=token, **cpu)
    shown = [repr(by_id), str(by_id), by_id.to_json(), "".join(traceback.format_exception(raised.value))]
    assert all(token not in text for text in [*shown, caplog.text])
