"""RBLNReranker behind a vector-store retriever, through LangChain's ContextualCompressionRetriever
(langchain-classic in LangChain 1.x)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rbln import RBLNReranker

CORPUS = json.loads((Path(__file__).parent / "data" / "corpus.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def retriever(minilm, minilm_embeddings, cpu) -> ContextualCompressionRetriever:
    documents = [Document(page_content=t, id=k, metadata={"topic": k}) for k, t in CORPUS["passages"].items()]
    store = InMemoryVectorStore.from_documents(documents, minilm_embeddings)
    return ContextualCompressionRetriever(
        base_compressor=RBLNReranker(model=minilm, top_n=3, **cpu),
        base_retriever=store.as_retriever(search_kwargs={"k": 10}),
    )


def check(results: list[Document], answer: str) -> None:
    assert 0 < len(results) <= 3
    assert results[0].metadata["topic"] == answer
    scores = [d.metadata["relevance_score"] for d in results]
    assert all(type(s) is float for s in scores)
    assert scores == sorted(scores, reverse=True)


def test_compression_retriever_returns_reranked_documents_with_scores(retriever):
    for item in CORPUS["queries"]:
        check(retriever.invoke(item["query"]), item["answer"])


async def test_compression_retriever_async(retriever):
    for item in CORPUS["queries"]:
        check(await retriever.ainvoke(item["query"]), item["answer"])


def test_reranker_scores_the_retrieved_candidates(retriever):
    query = CORPUS["queries"][0]["query"]
    candidates = retriever.base_retriever.invoke(query)
    reranked = retriever.invoke(query)
    reranker = retriever.base_compressor
    expected = sorted(reranker.engine.score(query, [d.page_content for d in candidates]), reverse=True)[:3]
    assert [d.metadata["relevance_score"] for d in reranked] == pytest.approx(expected, abs=1e-6)
    assert all("relevance_score" not in d.metadata for d in candidates)
