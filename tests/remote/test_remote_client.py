"""RemoteEngine against fake servers (tests/http_fakes.py), no engine: the client never guesses a model it was not
told (a description that fails is retried, then the call fails; replicas of different models are refused), one
deadline per call, Retry-After parsed defensively, close() during a call, calls split under the server's
max_inputs_per_request, NaN from a server refused, credentials in a base URL never shown. Fast: seconds in all."""

from __future__ import annotations

import logging
import threading
import traceback
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import numpy as np
import pytest
from http_fakes import E5_FAMILY, FakeModelServer, FakeServer, described, vector_of

from rbln_retrieval import NonFiniteResultError, get_engine
from rbln_retrieval.remote import RemoteClosedError, RemoteEngine, RemoteError, ReplicaMismatchError
from rbln_retrieval.remote.replicas import MAX_RETRY_AFTER, MIN_RETRY_AFTER, retry_after


def one_sentence(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and message.endswith("."), message
    return message


def test_a_description_that_fails_is_retried_and_the_prompts_are_kept():
    # A proxy answers 502 twice (a rolling restart): the call waits for the description, then sends E5's prompt.
    with FakeModelServer(described(), describe_failures=2) as server:
        with RemoteEngine("e5-fake", base_url=server.url, timeout=30) as remote:
            vectors = remote.embed(["what is rbln"], kind="query")
        assert server.inputs() == ["query: what is rbln"]
        np.testing.assert_array_equal(vectors[0], vector_of("query: what is rbln"))


def test_a_description_that_never_comes_fails_the_call_in_one_sentence_and_sends_nothing():
    with FakeModelServer(described(), describe_failures=10**6) as server:
        with RemoteEngine("e5-fake", base_url=server.url, max_retries=2, timeout=30) as remote:
            with pytest.raises(RemoteError) as failure:
                remote.embed(["what is rbln"], kind="query")
        message = one_sentence(failure.value)
        assert message.startswith("No replica described e5-fake (/v1/rbln-retrieval/model failed after 3 attempts")
        assert "answered HTTP 502" in message and server.bodies == [], "no text was sent without its prompt"


def test_replicas_that_describe_different_models_are_refused():
    revised = {**E5_FAMILY, "query_prompt": "Represent this query: "}
    with FakeModelServer(described()) as first, FakeModelServer(described(revised)) as second:
        with RemoteEngine("e5-fake", base_url=[first.url, second.url]) as remote:
            with pytest.raises(ReplicaMismatchError) as failure:
                remote.embed(["a"])
        message = one_sentence(failure.value)
        assert f"{first.url} has family.query_prompt='query: ' but {second.url} has 'Represent this query: '" in message
        assert first.bodies == second.bodies == []
    # Behind one URL: an answer for another model than the one the server lists.
    with FakeModelServer(described(), answer_model="e5-fake-v2") as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote, pytest.raises(ReplicaMismatchError) as failure:
            remote.embed(["a"])
        assert "answered /v1/embeddings for model 'e5-fake-v2', but the replicas serve 'e5-fake'" in str(failure.value)


def test_one_deadline_covers_the_whole_call_not_each_attempt():
    with FakeModelServer(described()) as server, RemoteEngine("e5-fake", base_url=server.url, max_retries=3) as remote:
        server.hold.clear()  # the server takes every request and never answers
        with pytest.raises(RemoteError) as failure:
            remote.embed(["a"], timeout=3)
        message = one_sentence(failure.value)
    assert message.startswith("/v1/embeddings got no answer within the call's timeout of 3 s (1 attempt); last: ")
    assert len(server.posts) == 1, "no retry starts once the call's deadline has passed"


@pytest.mark.parametrize(
    "header, seconds",
    [
        ("0", MIN_RETRY_AFTER),
        ("-5", MIN_RETRY_AFTER),
        ("nan", 1.0),
        ("inf", MAX_RETRY_AFTER),
        ("soon", 1.0),
        (None, 1.0),
        ("2.5", 2.5),
        ("86400", MAX_RETRY_AFTER),
    ],
)
def test_retry_after_is_parsed_defensively_and_clamped(header, seconds):
    assert retry_after(header) == seconds


def test_retry_after_as_an_http_date():
    assert retry_after(format_datetime(datetime.now(UTC) + timedelta(seconds=10), usegmt=True)) > 8
    assert retry_after(format_datetime(datetime.now(UTC) - timedelta(days=1), usegmt=True)) == MIN_RETRY_AFTER


def test_a_zero_retry_after_never_makes_the_client_resend_at_once():
    with FakeModelServer(described(), busy_posts=3, retry_after="0") as server:
        with RemoteEngine("e5-fake", base_url=server.url, timeout=30) as remote:
            remote.embed(["a"])
    gaps = [b - a for a, b in zip(server.posts, server.posts[1:])]
    assert len(gaps) == 3 and min(gaps) >= MIN_RETRY_AFTER, gaps


def test_close_during_a_call_wakes_the_callers_with_one_sentence():
    with FakeModelServer(described()) as server:
        remote = RemoteEngine("e5-fake", base_url=server.url, timeout=60)
        server.hold.clear()  # the answer waits until the test lets it go
        raised: list[BaseException] = []

        def call() -> None:
            try:
                remote.embed(["a"])
            except BaseException as exc:
                raised.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert server.entered.wait(30), "the call never reached the server"
        remote.close()
        caller.join(30)
        assert not caller.is_alive(), "close() left the caller waiting"
        server.hold.set()
    assert len(raised) == 1 and isinstance(raised[0], RemoteClosedError)
    assert one_sentence(raised[0]).endswith("was closed while this call was in flight.")
    with pytest.raises(RemoteClosedError, match=r"is closed; make a new one\.$"):
        remote.embed(["a"])


def test_calls_are_split_under_the_servers_max_inputs_per_request():
    texts = [f"text {i}" for i in range(10)]
    with FakeModelServer(described(max_inputs_per_request=3)) as server:
        with RemoteEngine("e5-fake", base_url=server.url, batch_size=64) as remote:
            vectors = remote.embed(texts)
        assert max(len(b["input"]) for b in server.bodies) == 3 and len(server.bodies) == 4
        assert sorted(server.inputs()) == sorted(f"passage: {t}" for t in texts)
        np.testing.assert_array_equal(vectors, [vector_of(f"passage: {t}") for t in texts])
    with FakeModelServer(described()) as server:  # a server that states no limit: its documented default, 2048
        with RemoteEngine("e5-fake", base_url=server.url, batch_size=5000) as remote:
            assert len(remote.embed(texts * 300)) == 3000
        assert sorted(len(b["input"]) for b in server.bodies) == [952, 2048]


def test_non_finite_vectors_and_scores_from_a_server_are_refused_naming_the_input():
    with FakeModelServer(described(), nan_at=(1,)) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote, pytest.raises(NonFiniteResultError) as failure:
            remote.embed(["a", "b", "c"])
    assert one_sentence(failure.value).startswith("The result for text 1 holds NaN")
    cross = {**E5_FAMILY, "name": "cross-encoder", "hidden_size": 0, "query_prompt": "", "document_prompt": ""}
    with FakeModelServer(described(cross), scores=[0.9, float("nan"), 0.1]) as server:
        with RemoteEngine("e5-fake", base_url=server.url) as remote, pytest.raises(NonFiniteResultError) as failure:
            remote.rerank("q", ["a", "b", "c"])
    assert one_sentence(failure.value).startswith("The result for document 1 holds NaN")


def test_credentials_in_a_base_url_never_show(caplog):
    caplog.set_level(logging.DEBUG)
    password = "s3cret-pw-9f2"
    with FakeServer("echo-headers") as echo, FakeServer("500") as failing:
        for server in (echo, failing):
            url = server.url.replace("http://", f"http://alice:{password}@")
            remote = RemoteEngine("m", base_url=url, max_retries=1, family="bi-encoder")
            with pytest.raises(Exception) as raised:
                remote.embed(["a"])
            remote.close()
            shown = {"repr": repr(remote), "error": "".join(traceback.format_exception(raised.value))}
            for where, text in {**shown, "logs": caplog.text}.items():
                assert password not in text and "alice:" not in text, f"the password appears in the {where}"
            assert server.url in shown["repr"]
            if server is echo:  # the credentials did reach the server (as basic auth), and came back redacted
                assert "'Authorization': 'Basic ***'" in str(raised.value)
    # A shared client's claim shows neither the base URL's password nor a Hugging Face token.
    handle = get_engine("m", base_url=f"http://alice:{password}@127.0.0.1:9", token="hf_tok_3e9a", attach=False)
    assert password not in repr(handle) and "hf_tok_3e9a" not in repr(handle), repr(handle)
    handle.close()
