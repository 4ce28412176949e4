"""What a request costs the server, counted before anything is tokenized (rbln_retrieval.server.cost), the quantized
route's faults (a model without embeddings, a client that disconnects), and one real cross-encoder server that
refuses an amplified /rerank at once while it answers a normal request beside it.

tests/server/test_backpressure.py holds the middleware's limits on a stand-in app."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH
from rbln_retrieval.server.cost import request_cost


def _cost(path: str, request: object):
    return request_cost(path, json.dumps(request).encode())


def test_a_query_counts_once_per_document_and_n_to_n_pairs_count_each_side_once():
    one_to_many = _cost("/score", {"queries": "q" * 4000, "documents": ["d" * 40] * 100})
    assert (one_to_many.inputs, one_to_many.what, one_to_many.tokens) == (100, "documents", (4000 + 40) * 100 // 4)
    assert one_to_many.longest == ("queries", 4000)
    pairs = _cost("/score", {"queries": ["q" * 4000] * 2, "documents": ["d" * 40] * 2})
    assert (pairs.inputs, pairs.longest) == (2, ("queries[0]", 4000))
    assert pairs.tokens == -(-len(json.dumps({"queries": ["q" * 4000] * 2, "documents": ["d" * 40] * 2})) // 4)


def test_only_the_scoring_routes_pair_their_fields():
    """/classify's `query`-named fields are no pairs; its inputs are counted as any other request's."""
    cost = _cost("/classify", {"query": "q" * 4000, "documents": ["d"] * 100, "input": ["a", "bb"]})
    assert (cost.inputs, cost.what, cost.longest) == (2, "input", ("input[1]", 2))


@pytest.mark.parametrize(
    ("request_body", "inputs", "longest"),
    [
        ({"input": "one text"}, 1, ("input", 8)),
        ({"input": [101, 2023, 102]}, 1, ("input", 0)),  # token ids: one prompt, no characters to tokenize
        ({"input": [[101, 102], [101, 2023, 102]]}, 2, ("input[0]", 0)),
        ({"messages": [{"role": "user", "content": "hello"}, {"role": "user", "content": "hi"}]}, 1, ("messages", 7)),
        ({"texts": ["a", "bbb"]}, 2, ("texts[1]", 3)),  # Cohere's /v2/embed
    ],
    ids=["text", "token-ids", "token-id-lists", "conversation", "cohere"],
)
def test_other_requests_count_their_inputs_and_characters(request_body, inputs, longest):
    cost = _cost("/v1/embeddings", request_body)
    assert (cost.inputs, cost.longest) == (inputs, longest)
    assert cost.tokens == -(-len(json.dumps(request_body)) // 4)  # their body's bytes, as before


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'{"model": "m"}', b"\xff\xfe"])
def test_a_body_vllm_will_refuse_costs_its_bytes(body):
    cost = request_cost("/rerank", body)
    assert (cost.inputs, cost.longest, cost.tokens) == (0, None, -(-len(body) // 4))


# -- one real server: a cross-encoder with the default limits -------------------------------------------------------


@pytest.fixture(scope="module")
def reranker(reranker_server):
    return reranker_server  # the session's cross-encoder server (tests/conftest.py), shared with the HTTP lanes


NORMAL = {"query": "what is a cat", "documents": ["a cat is an animal", "the sky is blue"]}
# The amplified body: an 80,000-word query and 150,000 one-word documents, 1.15 MB (under the 2 MB bound).
AMPLIFIED = {"query": "word " * 80_000, "documents": ["a"] * 150_000}
# Under every count limit, yet 2,000 pairs of a 200,000-character query: 100 M tokens to tokenize.
COSTLY = {"query": "word " * 40_000, "documents": ["a"] * 2000}


async def _timed(client: httpx.AsyncClient, path: str, body: dict) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = await client.post(path, json=body)
    return response, time.perf_counter() - started


@pytest.mark.server
async def test_an_amplified_rerank_is_refused_at_once_and_a_normal_request_beside_it_is_answered(reranker):
    """Without the cost bound vLLM tokenizes 150,000 pairs of a 400 KB query on its shared pool: the amplified
    request is answered 400 after seconds and every request after it waits behind the pairs."""
    async with httpx.AsyncClient(base_url=reranker.url, timeout=120) as client:
        for name, body, limit in (
            ("amplified", AMPLIFIED, "max_inputs_per_request of 2048"),
            ("costly", COSTLY, "max_queued_tokens of 1000000"),
        ):
            (refused, refused_s), (normal, normal_s) = await asyncio.gather(
                _timed(client, "/rerank", body), _timed(client, "/rerank", NORMAL)
            )
            assert refused.status_code == 413 and limit in refused.json()["error"]["message"], refused.text
            assert normal.status_code == 200 and len(normal.json()["results"]) == 2, normal.text
            size = len(json.dumps(body))
            print(f"\n{name} /rerank ({size} bytes): 413 in {refused_s:.2f} s; beside it 200 in {normal_s:.2f} s")
        # Nothing of the refused requests runs on after them.
        after, after_s = await _timed(client, "/v1/rerank", NORMAL)
        assert after.status_code == 200, after.text
        print(f"a normal /v1/rerank after them: 200 in {after_s:.2f} s")
        for path, body in (
            ("/score", {"queries": COSTLY["query"], "documents": COSTLY["documents"]}),
            ("/v1/score", {"text_1": COSTLY["query"], "text_2": COSTLY["documents"]}),
            ("/v2/rerank", COSTLY),
        ):
            response = await client.post(path, json=body)
            assert response.status_code == 413 and "max_queued_tokens of 1000000" in response.text, response.text


@pytest.mark.server
def test_the_quantized_route_on_a_served_reranker_is_refused_in_one_sentence(reranker):
    response = httpx.post(reranker.url + QUANTIZED_EMBED_PATH, json={"input": ["a"], "precision": "binary"})
    assert response.status_code == 400, response.text
    assert "it scores query-document pairs and gives no embeddings" in response.json()["error"]["message"]
