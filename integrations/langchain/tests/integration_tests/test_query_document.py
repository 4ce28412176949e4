"""Query vs document on a tiny Qwen3-Embedding: the family's query prompt is applied out of the box."""

from __future__ import annotations

import numpy as np
import pytest

from langchain_rbln import RBLNEmbeddings
from rbln_retrieval.models.specs.qwen3_embedding import QWEN3_DEFAULT_TASK

QUESTION = "How tall is Mount Everest?"


@pytest.fixture(scope="module")
def qwen3(tiny_model, cpu) -> RBLNEmbeddings:
    return RBLNEmbeddings(model=tiny_model("qwen3-embedding"), **cpu)


def test_default_query_prompt_is_qwen3s_instruction(qwen3):
    assert qwen3.query_instruction is None
    assert qwen3.query_prompt == f"Instruct: {QWEN3_DEFAULT_TASK}\nQuery:"
    assert qwen3.document_prompt == ""


def test_embed_query_is_the_engines_query_vector(qwen3):
    query = np.array(qwen3.embed_query(QUESTION))
    np.testing.assert_allclose(query, qwen3.engine.embed([QUESTION], kind="query")[0], atol=1e-6)
    # ... which is the prompted text embedded as is: the instruction really is part of the input.
    np.testing.assert_allclose(query, qwen3.engine.embed([qwen3.query_prompt + QUESTION])[0], atol=1e-5)


def test_embed_query_differs_from_embed_documents(qwen3):
    query = np.array(qwen3.embed_query(QUESTION))
    document = np.array(qwen3.embed_documents([QUESTION])[0])
    np.testing.assert_allclose(document, qwen3.engine.embed([QUESTION], kind="document")[0], atol=1e-6)
    assert float(query @ document) < 0.999


async def test_async_matches_sync(qwen3):
    np.testing.assert_allclose(await qwen3.aembed_query(QUESTION), qwen3.embed_query(QUESTION), atol=1e-6)
    np.testing.assert_allclose(await qwen3.aembed_documents([QUESTION]), qwen3.embed_documents([QUESTION]), atol=1e-6)


def test_query_instruction_replaces_the_task(qwen3):
    task = "Given a geography question, retrieve the passage with the answer"
    custom = qwen3.model_copy(update={"query_instruction": task})
    assert custom.engine.engine is qwen3.engine.engine
    assert custom.query_prompt == f"Instruct: {task}\nQuery:"
    vector = np.array(custom.embed_query(QUESTION))
    np.testing.assert_allclose(vector, qwen3.engine.embed([QUESTION], kind="query", instruction=task)[0], atol=1e-6)
    assert float(vector @ np.array(qwen3.embed_query(QUESTION))) < 0.999


def test_document_instruction_is_a_literal_prefix(qwen3):
    prefixed = qwen3.model_copy(update={"document_instruction": "passage: "})
    np.testing.assert_allclose(
        prefixed.embed_documents([QUESTION]), qwen3.embed_documents(["passage: " + QUESTION]), atol=1e-5
    )


def test_matryoshka_dimensions(tiny_model, cpu, qwen3):
    small = RBLNEmbeddings(model=tiny_model("qwen3-embedding"), dimensions=32, **cpu)
    assert small.engine.engine is qwen3.engine.engine  # dimensions is per call, not an engine setting
    vectors = np.array(small.embed_documents(["a", "b"]))
    assert vectors.shape == (2, 32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(vectors, qwen3.engine.embed(["a", "b"], dimensions=32), atol=1e-6)
    assert len(small.embed_query("a")) == 32
    with pytest.raises(ValueError, match=r"outside 1\.\.64"):
        RBLNEmbeddings(model=tiny_model("qwen3-embedding"), dimensions=65, **cpu)
