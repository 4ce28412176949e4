"""The one scoring router (rbln_retrieval.engines.scoring), on a fake engine: which of the engine's steps each kind of
model scores with, and the checks made before any of them runs. No model, no engine start."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from rbln_retrieval.engines.requests import EmbedRequest, ScoreRequest
from rbln_retrieval.engines.scoring import Scorer, score
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.spec import PairTemplate, Scoring
from rbln_retrieval.models.specs import SPECS_BY_NAME, spec_named
from rbln_retrieval.results.outputs import check_outputs


class FakeEngine:
    """Records each step the router asks for; vectors are chosen so each route's scores are recognisable."""

    def __init__(self, name: str):
        self.family = ModelFamily.build(name, architecture="Fake", hidden_size=2, max_length=64)
        self.calls: list[tuple[str, Any]] = []

    def scorer(self) -> Scorer:
        async def family() -> ModelFamily:
            return self.family

        async def tokenizer(family: ModelFamily) -> Any:
            raise AssertionError("no windows without truncate='chunk'")

        async def embed(texts: Iterable[str], request: EmbedRequest, *, truncate: Any, what: str = "texts") -> Any:
            texts = list(texts)
            self.calls.append(("embed", (request.kind, request.output, what)))
            if request.output == "sparse":
                return [{1: 1.0, 2: float(len(t))} for t in texts]
            if request.output == "multi_vector":
                return [np.array([[1.0, 0.0], [0.0, float(len(t))]], np.float32) for t in texts]
            return np.array([[1.0, float(len(t))] for t in texts], np.float32)

        async def pairs(query: str, documents: Iterable[str], **kwargs: Any) -> list[float]:
            self.calls.append(("pairs", kwargs["instruction"]))
            return [0.5 for _ in documents]

        async def qwen3(query: str, documents: Iterable[str], **kwargs: Any) -> list[float]:
            self.calls.append(("qwen3-reranker", kwargs["instruction"]))
            return [0.25 for _ in documents]

        return Scorer(
            model="fake",
            family=family,
            tokenizer=tokenizer,
            check_outputs=check_outputs,
            embed=embed,
            score_pairs=pairs,
            score_template=qwen3,
        )

    async def score(self, documents: list[str], **options: Any) -> list[float]:
        return await score(self.scorer(), "qq", documents, request=ScoreRequest(**options), truncate="end")


async def test_each_kind_of_model_scores_with_its_own_step():
    bi = FakeEngine("bi-encoder")
    assert await bi.score(["a", "abc"]) == [1.0 + 2 * 1, 1.0 + 2 * 3]  # cosine of the dense vectors
    assert bi.calls == [("embed", ("document", "dense", "documents")), ("embed", ("query", "dense", "texts"))]

    splade = FakeEngine("splade")
    assert await splade.score(["a", "abc"]) == [1.0 + 2 * 1, 1.0 + 2 * 3]  # dot product of the sparse vectors
    assert [c[1][1] for c in splade.calls] == ["sparse", "sparse"]

    colbert = FakeEngine("colbert")  # MaxSim summed over the query's vectors, whatever output says
    assert await colbert.score(["a", "abc"]) == [1.0 + 2 * 1, 1.0 + 2 * 3]
    assert [c[1][1] for c in colbert.calls] == ["multi_vector", "multi_vector"]

    m3 = FakeEngine("bge-m3")  # MaxSim averaged over the query's vectors
    assert await m3.score(["a", "abc"], output="multi_vector") == [(1.0 + 2 * 1) / 2, (1.0 + 2 * 3) / 2]

    cross = FakeEngine("cross-encoder")
    assert await cross.score(["a", "b"]) == [0.5, 0.5] and cross.calls == [("pairs", None)]

    qwen3 = FakeEngine("qwen3-reranker")
    assert await qwen3.score(["a"], instruction="Find it") == [0.25] and qwen3.calls == [("qwen3-reranker", "Find it")]


async def test_no_documents_score_nothing_and_ask_for_no_query_vector():
    for name in ("bi-encoder", "splade", "colbert"):
        engine = FakeEngine(name)
        assert await engine.score([]) == []
        assert [c[1][0] for c in engine.calls] == ["document"]


async def test_what_the_model_cannot_do_is_refused_before_any_step():
    cases = [
        ("cross-encoder", {"instruction": "x"}, "takes no instruction"),
        ("bi-encoder", {"output": "sparse"}, "score takes output='dense' or 'multi_vector'"),
        ("bi-encoder", {"output": "multi_vector"}, "cannot give output='multi_vector'"),
        ("splade", {"output": "multi_vector"}, "SPLADE model"),
    ]
    for name, options, message in cases:
        engine = FakeEngine(name)
        with pytest.raises(ValueError, match=message):
            await engine.score(["a"], **options)
        assert engine.calls == []
    engine = FakeEngine("bi-encoder")
    with pytest.raises(ValueError, match="query is empty"):
        await score(engine.scorer(), " ", ["a"], request=ScoreRequest(), truncate="end")
    assert engine.calls == []


async def test_a_family_scoring_another_way_needs_only_its_spec(monkeypatch):
    """The router reads a family's Scoring and pair template as data: a bi-encoder whose spec compares its sparse
    output scores by the sparse dot product, and a pair-reading spec with a template is read through the template
    reader, with no change outside the spec."""
    bi = spec_named("bi-encoder")
    respecced = {
        "bi-encoder": replace(bi, scoring=Scoring(compares="sparse"), outputs=("dense", "sparse")),
        "cross-encoder": replace(
            spec_named("cross-encoder"),
            scoring=Scoring(compares=None),
            pair_template=PairTemplate("<", "{instruction}{query}{document}", ">"),
        ),
    }
    for name, spec in respecced.items():
        monkeypatch.setitem(SPECS_BY_NAME, name, spec)
    sparse = FakeEngine("bi-encoder")
    assert await sparse.score(["a", "abc"]) == [1.0 + 2 * 1, 1.0 + 2 * 3]
    assert [c[1][1] for c in sparse.calls] == ["sparse", "sparse"]
    templated = FakeEngine("cross-encoder")
    assert await templated.score(["a"], instruction="Find it") == [0.25]  # now takes an instruction
    assert templated.calls == [("qwen3-reranker", "Find it")]


def test_a_spec_whose_scoring_does_not_fit_its_outputs_is_refused_when_written():
    bi = spec_named("bi-encoder")
    with pytest.raises(ValueError, match="compares sparse outputs but gives only"):
        replace(bi, scoring=Scoring(compares="sparse"))
    with pytest.raises(ValueError, match="has a pair template but embeds"):
        replace(bi, pair_template=PairTemplate("", "{query}{document}", ""))
