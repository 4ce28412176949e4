"""RBLNEmbeddings: LangChain's standard unit tests, field validation, engine sharing, batching and async."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from langchain_tests.unit_tests import EmbeddingsUnitTests
from model_builders import minilm_path
from pydantic import ValidationError

import rbln_retrieval.frameworks.settings
from langchain_rbln import RBLNEmbeddings


class TestRBLNEmbeddingsStandard(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[RBLNEmbeddings]:
        return RBLNEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"model": str(minilm_path()), "device": "cpu", "dtype": "float32"}

    @property
    def init_from_env_params(self) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
        return {"RBLN_API_KEY": "key-from-env"}, self.embedding_model_params, {"api_key": "key-from-env"}


def test_model_name_alias_and_path(minilm, cpu, minilm_embeddings):
    by_alias = RBLNEmbeddings(model_name=str(minilm), **cpu)
    assert by_alias.model == str(minilm) == RBLNEmbeddings(model=minilm, **cpu).model
    assert by_alias.engine.engine is minilm_embeddings.engine.engine


def test_objects_share_one_engine_per_settings(minilm, cpu, minilm_embeddings):
    other = RBLNEmbeddings(model=minilm, batch_size=7, query_instruction="query: ", show_progress=True, **cpu)
    # Call-time settings never split the engine; engine settings do (a new engine would start here).
    assert other.engine.engine is minilm_embeddings.engine.engine


@pytest.mark.parametrize(
    "bad",
    [
        {"batch_size": 0},
        {"dimensions": 0},
        {"device": "gpu"},
        {"truncate": "middle"},
        {"max_length": -1},
        {"timeout": 0},
        {"unknown_option": 1},
    ],
)
def test_invalid_fields_are_rejected_before_any_engine(monkeypatch, minilm, bad):
    monkeypatch.setattr(rbln_retrieval.frameworks.settings, "get_engine", _must_not_be_called)
    with pytest.raises(ValidationError):
        RBLNEmbeddings(model=minilm, **bad)


def test_assignment_is_validated(minilm_embeddings):
    with pytest.raises(ValidationError):
        minilm_embeddings.batch_size = 0
    assert minilm_embeddings.batch_size > 0


def test_reranker_model_is_rejected(cross_encoder_reranker, cpu):
    with pytest.raises(ValueError, match=r"is a reranker .* use RBLNReranker"):
        RBLNEmbeddings(model=cross_encoder_reranker.model, **cpu)


def test_dimensions_on_a_model_without_matryoshka_is_rejected(minilm, cpu):
    with pytest.raises(ValueError, match="does not support matryoshka dimensions"):
        RBLNEmbeddings(model=minilm, dimensions=128, **cpu)


def test_api_key_is_secret(monkeypatch, minilm, cpu):
    monkeypatch.delenv("RBLN_API_KEY", raising=False)
    embeddings = RBLNEmbeddings(model=minilm, api_key="do-not-print", **cpu)
    assert "do-not-print" not in repr(embeddings)
    assert embeddings.api_key.get_secret_value() == "do-not-print"
    assert RBLNEmbeddings(model=minilm, **cpu).api_key is None


def test_results_are_python_floats_matching_the_engine(minilm_embeddings):
    texts = ["The cat sat on the mat.", "NPUs accelerate neural networks."]
    vectors = minilm_embeddings.embed_documents(texts)
    assert all(type(x) is float for row in vectors for x in row)
    np.testing.assert_allclose(vectors, minilm_embeddings.engine.embed(texts), rtol=0, atol=1e-6)
    query = minilm_embeddings.embed_query(texts[0])
    assert all(type(x) is float for x in query)
    assert len(query) == minilm_embeddings.engine.dimension == 384


def test_empty_documents_do_not_touch_the_engine(monkeypatch, minilm_embeddings):
    monkeypatch.setattr(minilm_embeddings.engine, "embed", _must_not_be_called)
    assert minilm_embeddings.embed_documents([]) == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.embed_documents(["fine", 3]), r"texts\[1\] is int, expected str"),
        (lambda e: e.embed_documents("one string"), "must be a list of strings"),
        (lambda e: e.embed_query(None), "text is NoneType, expected str"),
    ],
)
def test_bad_input_raises_one_clear_type_error(minilm_embeddings, call, message):
    with pytest.raises(TypeError, match=message):
        call(minilm_embeddings)


def test_batch_size_bounds_texts_per_engine_call(monkeypatch, minilm, cpu, minilm_embeddings):
    embeddings = RBLNEmbeddings(model=minilm, batch_size=2, **cpu)
    texts = [f"sentence number {i}" for i in range(5)]
    expected = minilm_embeddings.embed_documents(texts)
    sizes = _spy(monkeypatch, embeddings.engine, "embed")
    np.testing.assert_allclose(embeddings.embed_documents(texts), expected, atol=1e-6)
    assert sizes == [2, 2, 1]


async def test_async_batches_and_matches_sync(monkeypatch, minilm, cpu, minilm_embeddings):
    embeddings = RBLNEmbeddings(model=minilm, batch_size=3, **cpu)
    texts = [f"another sentence {i}" for i in range(7)]
    expected = minilm_embeddings.embed_documents(texts)
    sizes = _spy(monkeypatch, embeddings.engine, "aembed")
    np.testing.assert_allclose(await embeddings.aembed_documents(texts), expected, atol=1e-6)
    assert sizes == [3, 3, 1]
    query = await embeddings.aembed_query(texts[0])
    np.testing.assert_allclose(query, minilm_embeddings.embed_query(texts[0]), atol=1e-6)


async def test_async_awaits_the_engine_without_threads_or_blocking(monkeypatch, minilm_embeddings):
    loop = asyncio.get_running_loop()
    # LangChain's default async methods run the sync ones in the loop's executor; ours must not.
    monkeypatch.setattr(loop, "run_in_executor", _must_not_be_called)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    texts = [f"concurrent caller {i} asks about topic {i % 7}" for i in range(40)]
    results = await asyncio.gather(
        minilm_embeddings.aembed_documents(texts), *(minilm_embeddings.aembed_query(t) for t in texts[:5])
    )
    ticked_while_embedding = ticks
    task.cancel()
    assert ticked_while_embedding > 0  # the caller's loop kept running while the engine worked
    np.testing.assert_allclose(results[0], minilm_embeddings.embed_documents(texts), atol=1e-6)
    np.testing.assert_allclose(results[1:], [minilm_embeddings.embed_query(t) for t in texts[:5]], atol=1e-6)


def test_default_prompts_are_the_models_own(minilm_embeddings, minilm, cpu):
    # all-MiniLM-L6-v2 declares no prompts; an explicit instruction is placed before the text as is.
    assert minilm_embeddings.query_prompt == "" and minilm_embeddings.document_prompt == ""
    prompted = RBLNEmbeddings(model=minilm, query_instruction="query: ", document_instruction="passage: ", **cpu)
    assert (prompted.query_prompt, prompted.document_prompt) == ("query: ", "passage: ")
    np.testing.assert_allclose(
        prompted.embed_query("tides"), minilm_embeddings.embed_documents(["query: tides"])[0], atol=1e-6
    )
    np.testing.assert_allclose(
        prompted.embed_documents(["tides"])[0], minilm_embeddings.embed_documents(["passage: tides"])[0], atol=1e-6
    )


def _spy(monkeypatch: pytest.MonkeyPatch, engine: Any, name: str) -> list[int]:
    """Record how many texts each call of the real ``engine.<name>`` receives, then call through."""
    sizes: list[int] = []
    real = getattr(engine, name)

    def spy(texts, *args, **kwargs):
        sizes.append(len(texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(engine, name, spy)
    return sizes


def _must_not_be_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("this input must not reach the engine")
