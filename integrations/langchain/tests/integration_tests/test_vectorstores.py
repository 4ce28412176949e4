"""End to end with real all-MiniLM-L6-v2: 118 short passages on distinct topics and 12 labeled questions
(data/corpus.json); every vector store must return the labeled passage first."""

from __future__ import annotations

import json
from pathlib import Path

import chromadb
import pytest
from langchain_chroma import Chroma
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

CORPUS = json.loads((Path(__file__).parent / "data" / "corpus.json").read_text(encoding="utf-8"))
DOCUMENTS = [Document(page_content=text, id=key, metadata={"topic": key}) for key, text in CORPUS["passages"].items()]
QUERIES = [(item["query"], item["answer"]) for item in CORPUS["queries"]]


def test_corpus_is_large_enough():
    assert len(DOCUMENTS) >= 100 and len(QUERIES) >= 10


def assert_labeled_queries_come_first(store: VectorStore) -> None:
    found = {query: store.similarity_search(query, k=3)[0].metadata["topic"] for query, _ in QUERIES}
    assert found == {query: answer for query, answer in QUERIES}


def test_in_memory_vector_store(minilm_embeddings):
    store = InMemoryVectorStore.from_documents(DOCUMENTS, minilm_embeddings)
    assert len(store.store) == len(DOCUMENTS)
    assert_labeled_queries_come_first(store)


async def test_in_memory_vector_store_async(minilm_embeddings):
    store = await InMemoryVectorStore.afrom_documents(DOCUMENTS, minilm_embeddings)
    for query, answer in QUERIES:
        assert (await store.asimilarity_search(query, k=1))[0].metadata["topic"] == answer


def test_chroma_persisted_and_reopened(minilm_embeddings, tmp_path):
    settings = chromadb.config.Settings(anonymized_telemetry=False)
    options = dict(
        collection_name="rbln",
        embedding_function=minilm_embeddings,
        persist_directory=str(tmp_path),
        client_settings=settings,
        collection_metadata={"hnsw:space": "cosine"},
    )
    Chroma(**options).add_documents(DOCUMENTS, ids=[d.id for d in DOCUMENTS])
    # chromadb caches one client per path; drop it so the reopened store really reads the directory.
    chromadb.api.client.SharedSystemClient.clear_system_cache()
    reopened = Chroma(**options)
    assert len(reopened.get()["ids"]) == len(DOCUMENTS)
    assert_labeled_queries_come_first(reopened)


def test_faiss(minilm_embeddings, tmp_path):
    store = FAISS.from_documents(DOCUMENTS, minilm_embeddings, ids=[d.id for d in DOCUMENTS])
    assert store.index.ntotal == len(DOCUMENTS)
    assert_labeled_queries_come_first(store)
    store.save_local(str(tmp_path))
    loaded = FAISS.load_local(str(tmp_path), minilm_embeddings, allow_dangerous_deserialization=True)
    assert_labeled_queries_come_first(loaded)


@pytest.mark.parametrize("k", [1, 5])
def test_search_with_scores_is_cosine(minilm_embeddings, k):
    store = InMemoryVectorStore.from_documents(DOCUMENTS, minilm_embeddings)
    query, answer = QUERIES[0]
    results = store.similarity_search_with_score(query, k=k)
    assert results[0][0].metadata["topic"] == answer
    expected = sum(a * b for a, b in zip(minilm_embeddings.embed_query(query), store.store[answer]["vector"]))
    assert results[0][1] == pytest.approx(expected, abs=1e-5)
