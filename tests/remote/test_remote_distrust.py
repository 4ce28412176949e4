"""RemoteEngine distrusts the server (fake servers of tests/http_fakes.py, no engine): an answer whose indices repeat
or miss, whose vectors have another width or dtype than asked (the quantized route included), whose scores are not
numbers, or whose body is over the client's bound is refused in one sentence naming the replica; replicas whose
weights differ are refused, a server without the fingerprint is not; an input over the server's max_input_chars is
cut as the call's truncation side says instead of meeting HTTP 413, and a scoring call counts its query once per
document, as the server's cost does, so a long query with many documents is split. Fast: seconds in all."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from http_fakes import E5_FAMILY, FakeModelServer, described, vector_of
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH
from rbln_retrieval.remote import RemoteEngine, ReplicaMismatchError, replicas
from rbln_retrieval.remote.replicas import RemoteError, UntrustedAnswerError
from rbln_retrieval.results.finite import NonFiniteResultError
from rbln_retrieval.server.cost import TOKEN_BYTES, request_cost

CROSS = {**E5_FAMILY, "name": "cross-encoder", "hidden_size": 0, "query_prompt": "", "document_prompt": ""}


def one_sentence(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and message.endswith("."), message
    return message


def repeat_first_index(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    answer["data"][1]["index"] = 0  # index 0 twice, index 1 never: the probe of issue 56
    return answer


def short_second_row(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    answer["data"][1]["embedding"] = base64.b64encode(np.zeros(3, dtype="<f4").tobytes()).decode()
    return answer


def drop_last_row(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    answer["data"].pop()
    return answer


def index_out_of_range(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    answer["data"][0]["index"] = 7
    return answer


def float_rows_for_a_quantized_call(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The quantized route answering float32 rows (NaN among them) and naming float32 as their dtype."""
    rows = np.full((len(answer["data"]), 4), np.nan, dtype="<f4")
    answer["data"] = [{"index": i, "embedding": base64.b64encode(r.tobytes()).decode()} for i, r in enumerate(rows)]
    return {**answer, "dtype": "float32"}


def wide_quantized_rows(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    for row in answer["data"]:
        row["embedding"] = base64.b64encode(np.zeros(9, dtype=np.int8).tobytes()).decode()
    return answer


def score_as_text(path: str, answer: dict[str, Any]) -> dict[str, Any]:
    answer["data"][2]["score"] = "0.9"
    return answer


LIES = {
    "an index twice": (repeat_first_index, "answered index 0 twice and no index 1, so its answer is refused."),
    "a short vector": (short_second_row, "answered a vector of 12 bytes for input 1, where 4 float32 values were"),
    "a missing row": (drop_last_row, "answered 2 results for 3 inputs, so its answer is refused."),
    "an index past the inputs": (index_out_of_range, "answered a result with index 7, outside 0 to 2, so its"),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_lying_embeddings_answer_is_refused_naming_the_replica(lie):
    edit, expected = LIES[lie]
    with FakeModelServer(described(), edit=edit) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote, pytest.raises(UntrustedAnswerError) as failure:
            remote.embed(["a", "b", "c"])
    message = one_sentence(failure.value)
    assert message.startswith(f"{server.url}/v1/embeddings ") and expected in message, message
    assert len(server.bodies) == 1, "a lying answer is refused, not retried"


def test_the_quantized_route_is_read_in_the_dtype_asked_not_the_one_the_server_names():
    quantizing = {**described(), "quantized_embeddings": QUANTIZED_EMBED_PATH}
    with FakeModelServer(quantizing) as server, RemoteEngine("e5-fake", base_url=server.url) as remote:
        codes = remote.embed(["a b", "cd"], precision="ubinary")
    assert codes.dtype == np.uint8 and codes.shape == (2, 1)
    bits = [np.packbits(np.asarray(vector_of(f"passage: {t}")) > 0)[0] for t in ("a b", "cd")]
    np.testing.assert_array_equal(codes[:, 0], bits)
    for edit, expected in (
        (float_rows_for_a_quantized_call, "answered dtype 'float32' for precision 'binary', which is int8, so its"),
        (wide_quantized_rows, "answered a vector of 9 bytes for input 0, where 1 int8 values were asked, so its"),
    ):
        with FakeModelServer(quantizing, edit=edit) as server, RemoteEngine("e5-fake", base_url=server.url) as remote:
            with pytest.raises(UntrustedAnswerError) as failure:
                remote.embed(["a", "b"], precision="binary")
        message = one_sentence(failure.value)
        assert message.startswith(f"{server.url}{QUANTIZED_EMBED_PATH} ") and expected in message, message


def test_a_score_that_is_not_a_number_is_refused_naming_the_replica():
    with FakeModelServer(described(CROSS), edit=score_as_text) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote, pytest.raises(UntrustedAnswerError) as failure:
            remote.rerank("q", ["a", "b", "c"])
    assert one_sentence(failure.value) == (
        f"{server.url}/score answered '0.9' as the score of input 2, not a number, so its answer is refused."
    )


def test_an_answer_over_the_clients_bound_is_refused_unread(monkeypatch):
    monkeypatch.setattr(replicas, "MAX_RESPONSE_BYTES", 4096)
    with FakeModelServer(described()) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote:
            assert remote.embed(["a"] * 3).shape == (3, 4), "an answer under the bound is read"
            server.edit = lambda path, answer: {**answer, "padding": "x" * 5000}
            with pytest.raises(UntrustedAnswerError) as failure:
                remote.embed(["b"])
    assert one_sentence(failure.value) == (
        f"{server.url}/v1/embeddings answered more than 4096 bytes, the most this client reads of one answer, so its "
        "answer is refused."
    )


def test_replicas_with_different_weights_are_refused_and_servers_without_the_fingerprint_are_not():
    with (
        FakeModelServer({**described(), "weights": "3f2a9c"}) as first,
        FakeModelServer({**described(), "weights": "77d01e"}) as second,
    ):
        with RemoteEngine("e5-fake", base_url=[first.url, second.url]) as remote:
            with pytest.raises(ReplicaMismatchError) as failure:
                remote.embed(["a"])
    assert f"{first.url} has weights='3f2a9c' but {second.url} has '77d01e'" in one_sentence(failure.value)
    assert first.bodies == second.bodies == []
    with FakeModelServer({**described(), "weights": "3f2a9c"}) as new, FakeModelServer(described()) as old:
        with RemoteEngine("e5-fake", base_url=[new.url, old.url]) as remote:
            assert remote.embed(["a"]).shape == (1, 4)


def test_an_input_over_the_servers_max_input_chars_is_cut_on_the_truncation_side():
    text = "".join(f"{i:04d}" for i in range(500))  # 2,000 characters
    with FakeModelServer(described(max_input_chars=100)) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote:
            remote.embed([text])
            remote.embed([text], truncate="start")
    assert server.inputs()[:2] == [("passage: " + text)[:100], text[-100:]]


def test_a_long_query_with_many_documents_is_split_as_the_server_counts_it():
    """The server's max_queued_tokens holds 8,000 bytes; a 1,000-byte query with forty 50-byte documents is 42,000
    bytes as the server counts it (the query once per document), though its body is 3,000."""
    query, documents = "q" * 1000, [f"document {i:02d} " + "d" * 38 for i in range(40)]
    with FakeModelServer(described(CROSS, max_queued_tokens=2000)) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote:
            assert remote.score(query, documents) == [0.5] * 40
    sent = [json.dumps({"model": "e5-fake", **body}).encode() for body in server.bodies]
    assert len(sent) > 5 and sorted(d for body in server.bodies for d in body["documents"]) == documents
    assert all(request_cost("/score", body).tokens <= 2000 for body in sent), [len(b) // TOKEN_BYTES for b in sent]


# -- any answer at all ---------------------------------------------------------------------------------------------
KEYS = ["data", "index", "embedding", "score", "dtype", "model", "object"]
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(["AAAAAA==", "", 10**400, -(2**64)]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), inner),
    max_leaves=12,
)


def edit_of(where: str, key: str, row: int, value: Any) -> Callable[[str, dict[str, Any]], Any]:
    """An edit of a true answer: the whole answer replaced by ``value``, its ``key``, or ``key`` of its ``row``."""

    def edit(path: str, answer: dict[str, Any]) -> Any:
        if where == "answer":
            return value
        if where == "key":
            return {**answer, key: value}
        answer["data"][row][key] = value
        return answer

    return edit


def distrusted(call: Callable[[], Any]) -> Any:
    """``call``'s result, or None when it raised what a lying server may cause: UntrustedAnswerError, a refusal of
    a non-finite result, or another one-sentence RemoteError; anything else fails the test."""
    try:
        return call()
    except (UntrustedAnswerError, NonFiniteResultError, RemoteError) as error:
        one_sentence(error)
        return None


@pytest.fixture(scope="module")
def fake_servers():
    quantizing = {**described(), "quantized_embeddings": QUANTIZED_EMBED_PATH}
    with (
        FakeModelServer(quantizing) as embedder,
        FakeModelServer(described(CROSS)) as scorer,
        RemoteEngine("e5-fake", base_url=embedder.url, max_retries=0) as embeds,
        RemoteEngine("e5-fake", base_url=scorer.url, max_retries=0) as scores,
    ):
        yield embedder, scorer, embeds, scores


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(where=st.sampled_from(["answer", "key", "row"]), key=st.sampled_from(KEYS), row=st.integers(0, 2), value=JSON)
@example(where="row", key="score", row=1, value=10**400)  # no float holds it
@example(where="row", key="score", row=0, value=float("nan"))
@example(where="row", key="embedding", row=2, value=base64.b64encode(np.full(4, np.inf, "<f4").tobytes()).decode())
@example(where="row", key="index", row=0, value=True)
def test_any_answer_gives_a_correct_result_or_a_one_sentence_refusal(fake_servers, where, key, row, value):
    """Arbitrary JSON in place of a true answer, or of a part of it: RemoteEngine returns rows of the width and
    dtype asked, all finite, in input order, or raises one sentence; never another exception."""
    embedder, scorer, embeds, scores = fake_servers
    embedder.edit = scorer.edit = edit_of(where, key, row, value)
    texts = ["a", "b b", "c c c"]
    vectors = distrusted(lambda: embeds.embed(texts))
    if vectors is not None:
        assert vectors.shape == (3, 4) and vectors.dtype == np.float32 and np.isfinite(vectors).all()
    codes = distrusted(lambda: embeds.embed(texts, precision="uint8", ranges=[[0.0] * 4, [100.0] * 4]))
    if codes is not None:
        assert codes.shape == (3, 4) and codes.dtype == np.uint8
    values = distrusted(lambda: scores.score("q", texts))
    if values is not None:
        assert len(values) == 3 and all(isinstance(v, float) and math.isfinite(v) for v in values)
    ranked = distrusted(lambda: scores.rerank("q", texts))
    if ranked is not None:
        assert sorted(index for index, _ in ranked) == [0, 1, 2]


def _outputs_row(**fields: Any) -> dict[str, Any]:
    matrix = np.arange(6, dtype="<f4")
    row = {
        "index": 0,
        "dense": base64.b64encode(np.ones(4, dtype="<f4").tobytes()).decode(),
        "sparse": {"indices": [3, 7], "values": [0.5, 1.25]},
        "multi_vector": {"shape": [2, 3], "data": base64.b64encode(matrix.tobytes()).decode()},
    }
    return {**row, **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"sparse": {"indices": [3, 7], "values": [0.5]}},
        {"sparse": {"indices": [3, 3], "values": [0.5, 1.0]}},
        {"sparse": {"indices": [True, 7], "values": [0.5, 1.0]}},
        {"sparse": {"indices": [-1, 7], "values": [0.5, 1.0]}},
        {"sparse": {"indices": [3, 7], "values": ["0.5", 1.0]}},
        {"sparse": [3, 7]},
        {"multi_vector": {"shape": [4, 3], "data": base64.b64encode(np.zeros(6, "<f4").tobytes()).decode()}},
        {"multi_vector": {"shape": [2, 3.0], "data": ""}},
        {"dense": "not base64!"},
        {"dense": base64.b64encode(b"\0" * 5).decode()},
    ],
)
def test_an_outputs_answer_that_breaks_the_protocol_is_refused(fields):
    """The outputs route's rows (sparse and token vectors from `rbln-retrieval serve`) are checked as the vector
    routes' are: each output decodes whole or the answer is refused, never a partial or reshaped result."""
    from rbln_retrieval.remote.answers import BadAnswer, output_rows

    names = ("dense", "sparse", "multi_vector")
    good = output_rows({"data": [_outputs_row()]}, 1, names)[0]
    assert good["sparse"] == {3: 0.5, 7: 1.25} and good["multi_vector"].shape == (2, 3) and len(good["dense"]) == 4
    with pytest.raises(BadAnswer, match=r"result 0 without a valid (dense|sparse|multi_vector) output"):
        output_rows({"data": [_outputs_row(**fields)]}, 1, names)
    narrow = base64.b64encode(np.ones(3, dtype="<f4").tobytes()).decode()
    with pytest.raises(BadAnswer, match="a dense vector of 3 values for input 1, after 4"):
        output_rows({"data": [_outputs_row(), _outputs_row(index=1, dense=narrow)]}, 2, names)
