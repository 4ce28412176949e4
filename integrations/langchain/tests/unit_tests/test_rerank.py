"""RBLNReranker: LangChain has no standard suite for document compressors, so this is the matrix the issue asks
for, on a tiny BERT cross-encoder (random weights: scores are arbitrary but deterministic), plus every family."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from langchain_core.documents import Document

from langchain_rbln import RBLNReranker

QUERY = "Which planet is known as the red planet?"
TEXTS = [
    "Mars is called the red planet because iron oxide dust covers its surface.",
    "Jupiter is the largest planet of the solar system.",
    "Bread rises because yeast releases carbon dioxide.",
    "Venus is the hottest planet.",
    "The Nile flows north into the Mediterranean.",
    "Saturn's rings are mostly water ice.",
]


def documents() -> list[Document]:
    return [
        Document(page_content=text, id=f"doc-{i}", metadata={"position": i, "tags": ["space", {"nested": [i]}]})
        for i, text in enumerate(TEXTS)
    ]


@pytest.fixture(scope="module")
def engine_scores(cross_encoder_reranker) -> list[float]:
    return cross_encoder_reranker.engine.score(QUERY, TEXTS)


@pytest.fixture
def reranker(cross_encoder_reranker) -> RBLNReranker:
    """A private copy of the session reranker (same engine), so tests may change its fields."""
    return cross_encoder_reranker.model_copy()


def _best_first(scores: list[float]) -> list[int]:
    return sorted(range(len(scores)), key=lambda i: -scores[i])


async def test_empty_input_returns_empty_without_touching_the_engine(monkeypatch, reranker):
    monkeypatch.setattr(reranker.engine, "score", _must_not_be_called)
    monkeypatch.setattr(reranker.engine, "ascore", _must_not_be_called)
    assert reranker.compress_documents([], QUERY) == []
    assert await reranker.acompress_documents([], QUERY) == []
    assert reranker.rerank([], QUERY) == []
    assert await reranker.arerank([], QUERY) == []


@pytest.mark.parametrize(
    ("top_n", "expected"),
    [(None, len(TEXTS)), (0, 0), (-1, 0), (1, 1), (len(TEXTS), len(TEXTS)), (len(TEXTS) + 5, len(TEXTS))],
)
def test_top_n(reranker, engine_scores, top_n, expected):
    reranker.top_n = top_n
    result = reranker.compress_documents(documents(), QUERY)
    assert [d.metadata["position"] for d in result] == _best_first(engine_scores)[:expected]
    assert [r["index"] for r in reranker.rerank(TEXTS, QUERY, top_n=top_n)] == _best_first(engine_scores)[:expected]


def test_top_n_defaults_to_three(cross_encoder_reranker):
    assert RBLNReranker.model_fields["top_n"].default == 3
    three = cross_encoder_reranker.model_copy(update={"top_n": 3})
    assert len(three.compress_documents(documents(), QUERY)) == 3


def test_order_and_scores_are_the_engines(reranker, engine_scores):
    result = reranker.compress_documents(documents(), QUERY)
    scores = [d.metadata["relevance_score"] for d in result]
    assert [d.metadata["position"] for d in result] == _best_first(engine_scores)
    assert scores == pytest.approx(sorted(engine_scores, reverse=True), abs=1e-6)
    assert all(type(s) is float for s in scores)


def test_score_threshold(reranker, engine_scores):
    ascending = sorted(engine_scores)
    threshold = (ascending[2] + ascending[3]) / 2  # between two scores, so it keeps exactly the best three
    reranker.score_threshold = threshold
    kept = reranker.compress_documents(documents(), QUERY)
    assert [d.metadata["position"] for d in kept] == _best_first(engine_scores)[:3]
    reranker.score_threshold = ascending[0]  # inclusive: a document scoring exactly the threshold stays
    assert len(reranker.compress_documents(documents(), QUERY)) == len(TEXTS)
    reranker.score_threshold = max(engine_scores) + 1
    assert reranker.compress_documents(documents(), QUERY) == []


def test_score_threshold_and_top_n_combine(reranker, engine_scores):
    reranker.top_n, reranker.score_threshold = 2, min(engine_scores)
    assert len(reranker.compress_documents(documents(), QUERY)) == 2


def test_new_documents_with_deep_copied_metadata_and_input_untouched(reranker):
    inputs = documents()
    before = copy.deepcopy(inputs)
    result = reranker.compress_documents(inputs, QUERY)
    assert inputs == before  # relevance_score was not written into the caller's documents
    for doc in result:
        original = inputs[doc.metadata["position"]]
        assert doc is not original and doc.metadata is not original.metadata
        assert doc.id == original.id and doc.page_content == original.page_content
        assert {k: v for k, v in doc.metadata.items() if k != "relevance_score"} == original.metadata
        doc.metadata["tags"][1]["nested"].append("changed")
    assert inputs == before  # nested values are copies too


def test_strings_and_documents_rank_alike(reranker):
    from_strings = reranker.rerank(TEXTS, QUERY)
    assert from_strings == reranker.rerank(documents(), QUERY)
    assert sorted(r["index"] for r in from_strings) == list(range(len(TEXTS)))
    assert set(from_strings[0]) == {"index", "relevance_score"}


async def test_sync_equals_async(reranker):
    reranker.top_n = 4
    sync_docs = reranker.compress_documents(documents(), QUERY)
    async_docs = await reranker.acompress_documents(documents(), QUERY)
    assert [d.id for d in async_docs] == [d.id for d in sync_docs]
    assert [d.metadata["relevance_score"] for d in async_docs] == pytest.approx(
        [d.metadata["relevance_score"] for d in sync_docs], abs=1e-6
    )
    assert await reranker.arerank(TEXTS, QUERY, top_n=2) == reranker.rerank(TEXTS, QUERY, top_n=2)


async def test_async_awaits_the_engine_without_threads(monkeypatch, reranker, engine_scores):
    monkeypatch.setattr(asyncio.get_running_loop(), "run_in_executor", _must_not_be_called)
    result = await reranker.acompress_documents(documents(), QUERY)
    assert [d.metadata["position"] for d in result] == _best_first(engine_scores)


def test_batch_size_bounds_documents_per_engine_call(monkeypatch, reranker, engine_scores):
    reranker.batch_size = 4
    sizes: list[int] = []
    real = reranker.engine.score

    def spy(query, batch, **kwargs):
        sizes.append(len(batch))
        return real(query, batch, **kwargs)

    monkeypatch.setattr(reranker.engine, "score", spy)
    ranked = reranker.rerank(TEXTS, QUERY)
    assert sizes == [4, 2]
    assert [r["index"] for r in ranked] == _best_first(engine_scores)


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda r: r.compress_documents(TEXTS, QUERY), TypeError, r"documents\[0\] is str, expected Document"),
        (lambda r: r.rerank("one string", QUERY), TypeError, "not a single str"),
        (lambda r: r.rerank(["fine", 7], QUERY), TypeError, r"documents\[1\] is int, expected str or Document"),
        (lambda r: r.rerank(TEXTS, ""), ValueError, "query is empty"),
    ],
)
def test_bad_input_raises_one_clear_error(reranker, call, error, message):
    with pytest.raises(error, match=message):
        call(reranker)


def test_cross_encoder_rejects_an_instruction(cross_encoder_reranker, cpu):
    with pytest.raises(ValueError, match="takes no instruction"):
        RBLNReranker(model=cross_encoder_reranker.model, instruction="Find answers", **cpu)


@pytest.mark.parametrize("family", ["bert-cross-encoder", "qwen3-reranker", "bi-encoder"])
async def test_every_family_reranks_by_the_engines_scores(tiny_model, minilm, cpu, family):
    model = minilm if family == "bi-encoder" else tiny_model(family)
    reranker = RBLNReranker(model=model, top_n=None, **cpu)
    scores = reranker.engine.score(QUERY, TEXTS)
    result = reranker.compress_documents(documents(), QUERY)
    assert [d.metadata["position"] for d in result] == _best_first(scores)
    assert [d.metadata["relevance_score"] for d in result] == pytest.approx(sorted(scores, reverse=True), abs=1e-6)
    async_result = await reranker.acompress_documents(documents(), QUERY)
    assert [d.metadata["position"] for d in async_result] == _best_first(scores)
    if family == "bi-encoder":  # a real model: the relevant passage wins
        assert result[0].metadata["position"] == 0


@pytest.mark.parametrize("family", ["qwen3-reranker", "bi-encoder"])
def test_instruction_reaches_the_engine(tiny_model, minilm, cpu, family):
    model = minilm if family == "bi-encoder" else tiny_model(family)
    instruction = "Given a question about astronomy, find the passage that answers it"
    instructed = RBLNReranker(model=model, instruction=instruction, top_n=None, **cpu)
    plain = instructed.model_copy(update={"instruction": None})
    expected = instructed.engine.score(QUERY, TEXTS, instruction=instruction)
    got = {r["index"]: r["relevance_score"] for r in instructed.rerank(TEXTS, QUERY)}
    assert [got[i] for i in range(len(TEXTS))] == pytest.approx(expected, abs=1e-6)
    default = {r["index"]: r["relevance_score"] for r in plain.rerank(TEXTS, QUERY)}
    assert [default[i] for i in range(len(TEXTS))] != pytest.approx(expected, abs=1e-6)


def _must_not_be_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("this input must not reach the engine")
