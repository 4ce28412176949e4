"""RBLNReranker on real engines: a tiny random-weight BERT cross-encoder for the mechanics (scores, order, top_n,
events), all-MiniLM-L6-v2 (real weights, cosine scores) for relevance and instructions."""

from __future__ import annotations

import asyncio
import random

import pytest
import reference
from llama_index.core import VectorStoreIndex
from llama_index.core.bridge.pydantic import Field
from llama_index.core.callbacks import CallbackManager, CBEventType, EventPayload, LlamaDebugHandler
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from llama_index.embeddings.rbln import RBLNEmbedding
from llama_index.postprocessor.rbln_rerank import RBLNReranker
from rbln_retrieval import get_engine

QUERY = "Why does Mars look red?"
# Separate engine calls batch their inputs differently, which moves float32 scores in the last bits.
TOL = 1e-5


@pytest.fixture(scope="module")
def cross_encoder(tiny_model) -> str:
    return str(tiny_model("bert-cross-encoder"))


@pytest.fixture
def nodes(corpus_nodes) -> list[NodeWithScore]:
    """Eight retrieved nodes with descending retrieval scores."""
    return [NodeWithScore(node=node, score=1.0 - i / 10) for i, node in enumerate(corpus_nodes[26:34])]


def texts_of(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]


def assert_same_ranking(actual: list[NodeWithScore], expected: list[NodeWithScore]) -> None:
    assert [n.node.node_id for n in actual] == [n.node.node_id for n in expected]
    assert [n.score for n in actual] == pytest.approx([n.score for n in expected], abs=TOL)


def test_class_hierarchy_and_name():
    assert BaseNodePostprocessor in RBLNReranker.__mro__
    assert RBLNReranker.class_name() == "RBLNReranker"


def test_serialization_round_trip(cross_encoder, cpu, monkeypatch):
    monkeypatch.setenv("RBLN_API_KEY", "secret-from-env")
    original = RBLNReranker(
        model=cross_encoder, top_n=None, score_threshold=0.25, keep_retrieval_score=True, batch_size=5, **cpu
    )
    data = original.to_dict()
    assert data["class_name"] == "RBLNReranker"
    assert "api_key" not in data and "secret-from-env" not in original.to_json()
    restored = RBLNReranker.from_json(original.to_json())
    assert restored.to_dict() == data
    assert (restored.top_n, restored.score_threshold, restored.batch_size) == (None, 0.25, 5)


def test_scores_are_the_engines_best_first_on_new_objects(cross_encoder, cpu, nodes):
    before = [(n.score, dict(n.node.metadata)) for n in nodes]
    reranked = RBLNReranker(model=cross_encoder, top_n=None, **cpu).postprocess_nodes(nodes, query_str=QUERY)
    expected = get_engine(cross_encoder, **cpu).score(QUERY, texts_of(nodes))
    assert len(reranked) == len(nodes)
    assert all(type(n.score) is float for n in reranked)
    assert [n.score for n in reranked] == sorted([n.score for n in reranked], reverse=True)
    by_id = {n.node.node_id: s for n, s in zip(nodes, expected)}
    assert [n.score for n in reranked] == pytest.approx([by_id[n.node.node_id] for n in reranked], abs=TOL)
    assert not any(out is inp for out in reranked for inp in nodes)
    assert [(n.score, dict(n.node.metadata)) for n in nodes] == before


@pytest.mark.parametrize(("top_n", "count"), [(None, 8), (3, 3), (1, 1), (8, 8), (13, 8), (0, 0), (-2, 0)])
def test_top_n(cross_encoder, cpu, nodes, top_n, count):
    reranker = RBLNReranker(model=cross_encoder, top_n=top_n, **cpu)
    reranked = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert len(reranked) == count
    full = RBLNReranker(model=cross_encoder, top_n=None, **cpu).postprocess_nodes(nodes, query_str=QUERY)
    assert [n.score for n in reranked] == pytest.approx([n.score for n in full[:count]], abs=TOL)


def test_default_top_n_is_three(cross_encoder, cpu, nodes):
    assert len(RBLNReranker(model=cross_encoder, **cpu).postprocess_nodes(nodes, query_str=QUERY)) == 3


def test_score_threshold(cross_encoder, cpu, nodes):
    scores = sorted(get_engine(cross_encoder, **cpu).score(QUERY, texts_of(nodes)), reverse=True)
    threshold = (scores[4] + scores[5]) / 2  # five nodes score above it
    reranker = RBLNReranker(model=cross_encoder, top_n=None, score_threshold=threshold, **cpu)
    assert [n.score for n in reranker.postprocess_nodes(nodes, query_str=QUERY)] == pytest.approx(scores[:5], abs=TOL)
    reranker = RBLNReranker(model=cross_encoder, top_n=2, score_threshold=threshold, **cpu)
    assert [n.score for n in reranker.postprocess_nodes(nodes, query_str=QUERY)] == pytest.approx(scores[:2], abs=TOL)


def test_keep_retrieval_score_copies_the_node(cross_encoder, cpu, nodes):
    retrieval = {n.node.node_id: n.score for n in nodes}
    reranked = RBLNReranker(model=cross_encoder, top_n=None, keep_retrieval_score=True, **cpu).postprocess_nodes(
        nodes, query_str=QUERY
    )
    for n in reranked:
        assert n.node.metadata["retrieval_score"] == retrieval[n.node.node_id]
        assert "retrieval_score" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert "retrieval_score" not in n.node.get_content(metadata_mode=MetadataMode.EMBED)
    assert not any("retrieval_score" in n.node.metadata for n in nodes)


def test_node_content_is_ranked_with_its_embed_metadata(cross_encoder, cpu):
    node = TextNode(
        text="Olympus Mons is a volcano.",
        metadata={"planet": "Mars", "file": "notes.txt"},
        excluded_embed_metadata_keys=["file"],
    )
    reranked = RBLNReranker(model=cross_encoder, **cpu).postprocess_nodes([NodeWithScore(node=node)], query_str=QUERY)
    engine = get_engine(cross_encoder, **cpu)
    embed_text = node.get_content(metadata_mode=MetadataMode.EMBED)
    assert "planet: Mars" in embed_text and "notes.txt" not in embed_text
    assert reranked[0].score == pytest.approx(engine.score(QUERY, [embed_text])[0], abs=TOL)
    assert reranked[0].score != pytest.approx(engine.score(QUERY, [node.text])[0], abs=TOL)


def test_batches_give_the_same_scores(cross_encoder, cpu, nodes, monkeypatch):
    reranker = RBLNReranker(model=cross_encoder, top_n=None, batch_size=3, **cpu)
    sizes = []
    score = reranker._engine.score
    monkeypatch.setattr(
        reranker._engine, "score", lambda q, docs, **kw: sizes.append(len(docs)) or score(q, docs, **kw)
    )
    batched = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert sizes == [3, 3, 2]
    whole = RBLNReranker(model=cross_encoder, top_n=None, **cpu).postprocess_nodes(nodes, query_str=QUERY)
    assert_same_ranking(batched, whole)


async def test_async_equals_sync(cross_encoder, cpu, nodes):
    reranker = RBLNReranker(model=cross_encoder, top_n=5, batch_size=3, **cpu)
    sync = reranker.postprocess_nodes(nodes, query_str=QUERY)
    asynchronous = await reranker.apostprocess_nodes(nodes, query_str=QUERY)
    assert_same_ranking(asynchronous, sync)


async def test_missing_query_and_empty_input(cross_encoder, cpu, nodes, monkeypatch):
    reranker = RBLNReranker(model=cross_encoder, **cpu)
    with pytest.raises(ValueError, match="needs a query"):
        reranker.postprocess_nodes(nodes)
    with pytest.raises(ValueError, match="needs a query"):
        await reranker.apostprocess_nodes(nodes)

    def untouchable(*args, **kwargs):
        raise AssertionError("the engine must not be called for empty input")

    monkeypatch.setattr(reranker._engine, "score", untouchable)
    monkeypatch.setattr(reranker._engine, "ascore", untouchable)
    assert reranker.postprocess_nodes([], query_str=QUERY) == []
    assert await reranker.apostprocess_nodes([], query_bundle=QueryBundle(QUERY)) == []


def test_minilm_reranks_the_labeled_passage_first(minilm, cpu, corpus, corpus_nodes):
    reranker = RBLNReranker(model=minilm, top_n=3, **cpu)
    by_label = {n.node_id: n for n in corpus_nodes}
    rng = random.Random(0)
    for item in corpus["queries"]:
        candidates = [by_label[item["answer"]], *rng.sample(corpus_nodes, 15)]
        rng.shuffle(candidates)
        reranked = reranker.postprocess_nodes(
            [NodeWithScore(node=n, score=0.0) for n in candidates], query_str=item["query"]
        )
        assert reranked[0].node.metadata["label"] == item["answer"], item["query"]


def test_instruction_reaches_the_engine(minilm, cpu, nodes):
    # For a bi-encoder the instruction is the query prefix.
    reranked = RBLNReranker(model=minilm, top_n=None, instruction="Question: ", **cpu).postprocess_nodes(
        nodes, query_str=QUERY
    )
    engine = get_engine(minilm, **cpu)
    expected = engine.score(QUERY, texts_of(nodes), instruction="Question: ")
    assert [n.score for n in reranked] == pytest.approx(sorted(expected, reverse=True), abs=TOL)
    assert sorted(expected) != pytest.approx(sorted(engine.score(QUERY, texts_of(nodes))), abs=TOL)


def test_cross_encoder_rejects_an_instruction(cross_encoder, cpu, nodes):
    with pytest.raises(ValueError, match="takes no instruction"):
        RBLNReranker(model=cross_encoder, instruction="Find", **cpu).postprocess_nodes(nodes, query_str=QUERY)


def test_late_interaction_scores_bge_m3_by_maxsim(tiny_model, cross_encoder, cpu, nodes):
    path = str(tiny_model("bge-m3"))
    reranked = RBLNReranker(model=path, top_n=None, late_interaction=True, **cpu).postprocess_nodes(
        nodes, query_str=QUERY
    )
    engine = get_engine(path, **cpu)
    expected = engine.score(QUERY, texts_of(nodes), output="multi_vector")
    by_id = {n.node.node_id: s for n, s in zip(nodes, expected)}
    assert [n.score for n in reranked] == pytest.approx([by_id[n.node.node_id] for n in reranked], abs=TOL)
    assert [n.score for n in reranked] == sorted(expected, reverse=True)
    assert max(abs(a - b) for a, b in zip(expected, engine.score(QUERY, texts_of(nodes)))) > 1e-3
    with pytest.raises(ValueError, match=r"has no multi-vector \(late-interaction\) head \(family cross-encoder\)"):
        RBLNReranker(model=cross_encoder, late_interaction=True, **cpu).postprocess_nodes(nodes, query_str=QUERY)


def test_colbert_model_reranks_by_maxsim_without_flags(tiny_model, cpu, nodes):
    """A ColBERT checkpoint scores only by late interaction: no flag needed, same ranking and scores as the
    plain-torch ColBERT reference (summed MaxSim), sync and async."""
    path = str(tiny_model("colbert"))
    (query,) = reference.colbert(path, [QUERY], max_length=512)
    documents = reference.colbert(path, texts_of(nodes), max_length=512)
    expected = {n.node.node_id: reference.colbert_maxsim(query, d) for n, d in zip(nodes, documents)}
    reranker = RBLNReranker(model=path, top_n=None, **cpu)
    for reranked in (
        reranker.postprocess_nodes(nodes, query_str=QUERY),
        asyncio.run(reranker.apostprocess_nodes(nodes, query_str=QUERY)),
    ):
        assert [n.node.node_id for n in reranked] == sorted(expected, key=lambda i: -expected[i])
        assert [n.score for n in reranked] == pytest.approx([expected[n.node.node_id] for n in reranked], abs=TOL)


class RecordingHandler(BaseEventHandler):
    events: list = Field(default_factory=list)  # a pydantic field: one list per handler

    @classmethod
    def class_name(cls) -> str:
        return "RecordingHandler"

    def handle(self, event, **kwargs) -> None:
        if isinstance(event, (ReRankStartEvent, ReRankEndEvent)):
            self.events.append(event)


@pytest.fixture
def rerank_events():
    handler = RecordingHandler(events=[])
    root = get_dispatcher()
    root.add_event_handler(handler)
    yield handler.events
    root.event_handlers.remove(handler)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_query_engine_with_reranker(minilm, cross_encoder, cpu, corpus_nodes, rerank_events, mode):
    debug = LlamaDebugHandler()
    reranker = RBLNReranker(model=cross_encoder, top_n=3, **cpu)
    index = VectorStoreIndex(corpus_nodes, embed_model=RBLNEmbedding(model_name=minilm, **cpu))
    # The query engine hands its callback manager to its postprocessors.
    engine = RetrieverQueryEngine.from_args(
        index.as_retriever(similarity_top_k=10),
        llm=MockLLM(),
        node_postprocessors=[reranker],
        callback_manager=CallbackManager([debug]),
    )
    query = "What makes bread dough rise?"
    response = engine.query(query) if mode == "sync" else await engine.aquery(query)

    sources = response.source_nodes
    assert len(sources) == 3
    scores = [n.score for n in sources]
    assert all(type(s) is float for s in scores) and scores == sorted(scores, reverse=True)
    assert scores == pytest.approx(get_engine(cross_encoder, **cpu).score(query, texts_of(sources)), abs=TOL)

    start, end = rerank_events
    assert isinstance(start, ReRankStartEvent) and isinstance(end, ReRankEndEvent)
    assert (start.query.query_str, start.top_n, start.model_name, len(start.nodes)) == (query, 3, cross_encoder, 10)
    assert_same_ranking(end.nodes, sources)

    [(begin, finish)] = debug.get_event_pairs(CBEventType.RERANKING)
    assert begin.payload[EventPayload.TOP_K] == 3 and begin.payload[EventPayload.QUERY_STR] == query
    assert finish.payload[EventPayload.NODES] == end.nodes
