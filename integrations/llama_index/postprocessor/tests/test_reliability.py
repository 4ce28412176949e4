"""docs/reliability.md rows that apply to the LlamaIndex RBLNReranker: top_n bounds with each node at most once,
NaN/infinite score_threshold, and an API key that never shows."""

from __future__ import annotations

import math

import pytest
from http_fakes import API_KEY, assert_api_key_hidden
from llama_index.core.schema import NodeWithScore, TextNode

from llama_index.postprocessor.rbln_rerank import RBLNReranker

QUERY = "Which planet is red?"
TEXTS = ["Mars looks red.", "", "Jupiter is big.", "Mars looks red.", "火星は赤い。", "Venus is hot.", "  "]


def nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(id_=str(i), text=t), score=1.0) for i, t in enumerate(TEXTS)]


@pytest.mark.parametrize("top_n, expected", [(-1, 0), (0, 0), (2, 2), (100, len(TEXTS))])
def test_top_n_bounds(minilm, cpu, top_n, expected):
    kept = RBLNReranker(model=minilm, top_n=top_n, batch_size=3, **cpu).postprocess_nodes(nodes(), query_str=QUERY)
    assert len(kept) == expected
    assert len({n.node.node_id for n in kept}) == expected, "each node at most once"


@pytest.mark.parametrize("threshold", [math.nan, math.inf, -math.inf])
def test_nan_or_infinite_score_threshold_is_rejected_at_construction(minilm, cpu, threshold):
    with pytest.raises(ValueError, match="score_threshold"):
        RBLNReranker(model=minilm, score_threshold=threshold, **cpu)


def test_api_key_never_appears_in_repr_logs_or_errors(minilm, caplog):
    assert_api_key_hidden(
        lambda url: RBLNReranker(model=minilm, base_url=url, api_key=API_KEY, timeout=2),
        lambda obj: obj.postprocess_nodes(nodes(), query_str=QUERY),
        caplog,
    )
