"""Remote mode: vLLM's OpenAI server with our presets, and the replica-aware client, against local results."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from corpus import mixed_length, passages
from model_builders import HUB_MINILM
from servers import Server
from tolerances import BF16_OPTIONS, BF16_SCORE, assert_bf16_close_to_float32, assert_bf16_paths_agree

from rbln_retrieval import PoolingEngine, get_engine
from rbln_retrieval.remote import RemoteAuthError, RemoteEngine

pytestmark = pytest.mark.server

API_KEY = "test-secret-key-5f2a9c"
QUERY = "How are exceptions raised and handled in Python?"


@pytest.fixture(scope="module")
def servers(minilm, tiny_models, tmp_path_factory, hub_cache):
    """Two MiniLM replicas, MiniLM started from its Hugging Face id (offline, from hub_cache) in bfloat16, and one
    server per tiny reranker/Qwen3 family, all behind the same API key."""
    logs = tmp_path_factory.mktemp("server-logs")
    models = {
        "minilm-a": minilm,
        "minilm-b": minilm,
        **{name: tiny_models[name] for name in ("qwen3-embedding", "qwen3-reranker", "bert-cross-encoder")},
    }
    env = {"HF_HUB_CACHE": str(hub_cache)}
    started = {name: Server(path, logs / f"{name}.log", api_key=API_KEY, env=env) for name, path in models.items()}
    # One server proves both what a server started from an id publishes and what bfloat16 serving promises.
    bf16 = {k: v for k, v in BF16_OPTIONS.items() if k != "device"}
    started["minilm-id-bf16"] = Server(
        f"{HUB_MINILM}@main", logs / "minilm-id-bf16.log", api_key=API_KEY, env=env, options=bf16
    )
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        codes = {name: server.stop() for name, server in started.items()}
    for name, code in codes.items():
        assert name == "minilm-b" or code == 0, f"{name} did not shut down cleanly on SIGTERM (exit {code})"


def _remote(model, *urls, **kwargs) -> RemoteEngine:
    return RemoteEngine(model, base_url=list(urls), api_key=API_KEY, **kwargs)


def test_server_exposes_health_and_metrics_on_loopback(servers):
    import httpx

    url = servers["minilm-a"].url
    assert url.startswith("http://127.0.0.1:")
    assert httpx.get(url + "/health").status_code == 200
    metrics = httpx.get(url + "/metrics")
    assert metrics.status_code == 200 and "# TYPE" in metrics.text  # Prometheus exposition format


def test_remote_embed_equals_local_for_documents_and_queries(servers, minilm, minilm_engine):
    texts = mixed_length(120)
    with _remote(minilm, servers["minilm-a"].url) as remote:
        np.testing.assert_allclose(remote.embed(texts), minilm_engine.embed(texts), atol=1e-5)
        np.testing.assert_allclose(
            remote.embed([QUERY], kind="query"), minilm_engine.embed([QUERY], kind="query"), atol=1e-5
        )
        assert remote.score(QUERY, texts[:20]) == pytest.approx(minilm_engine.score(QUERY, texts[:20]), abs=1e-5)
        assert [i for i, _ in remote.rerank(QUERY, texts[:20], top_n=5)] == [
            i for i, _ in minilm_engine.rerank(QUERY, texts[:20], top_n=5)
        ]
        assert remote.embed([]).shape == (0, 384)


def test_a_bfloat16_server_equals_local_bfloat16_within_its_bounds(
    servers, hub_cache, minilm_bf16_engine, minilm_engine
):
    """remote == local in bfloat16: another process and other batches, so equal within two paths' bound, and
    within the promise of float32."""
    texts = mixed_length(40)[::2]
    with _remote(f"{HUB_MINILM}@main", servers["minilm-id-bf16"].url, cache_folder=hub_cache) as remote:
        vectors = remote.embed(texts)
        assert_bf16_paths_agree(vectors, minilm_bf16_engine.embed(texts))
        assert_bf16_close_to_float32(vectors, minilm_engine.embed(texts))
        scores = np.array(remote.score(QUERY, texts))
        assert np.abs(scores - np.array(minilm_engine.score(QUERY, texts))).max() <= BF16_SCORE


def test_remote_qwen3_embedding_applies_the_query_instruction_like_local(servers, tiny_models):
    path = tiny_models["qwen3-embedding"]
    local = PoolingEngine.shared(path, device="cpu", dtype="float32")
    with _remote(path, servers["qwen3-embedding"].url) as remote:
        for kwargs in ({}, {"kind": "query"}, {"kind": "query", "instruction": "Find Python docs"}):
            np.testing.assert_allclose(
                remote.embed([QUERY, "plain"], **kwargs), local.embed([QUERY, "plain"], **kwargs), atol=1e-5
            )
        np.testing.assert_allclose(
            remote.embed(["a b c"], dimensions=16), local.embed(["a b c"], dimensions=16), atol=1e-5
        )


@pytest.mark.parametrize("name", ["qwen3-reranker", "bert-cross-encoder"])
async def test_remote_rerankers_equal_local(servers, tiny_models, name):
    path = tiny_models[name]
    local = PoolingEngine.shared(path, device="cpu", dtype="float32")
    # Within max_length: over-long Qwen3-Reranker pairs are cut by the server at the end (see README, remote mode).
    docs = [p for p in passages(min_words=3) if len(p.split()) < 150][:30]
    with _remote(path, servers[name].url) as remote:
        assert remote.score(QUERY, docs) == pytest.approx(local.score(QUERY, docs), abs=1e-5)
        assert await remote.ascore(QUERY, docs) == pytest.approx(local.score(QUERY, docs), abs=1e-5)
        remote_top, local_top = remote.rerank(QUERY, docs, top_n=3), local.rerank(QUERY, docs, top_n=3)
        assert [i for i, _ in remote_top] == [i for i, _ in local_top]
        assert [s for _, s in remote_top] == pytest.approx([s for _, s in local_top], abs=1e-5)


def test_a_server_started_from_an_id_publishes_it_and_clients_pass_the_same_id(servers, hub_cache, minilm_bf16_engine):
    import httpx

    url = servers["minilm-id-bf16"].url
    served = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()["data"]
    assert [model["id"] for model in served] == [HUB_MINILM]
    texts = mixed_length(40)
    with _remote(f"{HUB_MINILM}@main", url, cache_folder=hub_cache) as remote:
        assert remote.family.pool.hidden_size == 384  # read from the id's configs in the client's cache
        # The server computes in bfloat16: the id's model, within what two bfloat16 paths agree to.
        assert_bf16_paths_agree(remote.embed(texts), minilm_bf16_engine.embed(texts))
        assert_bf16_paths_agree(remote.embed([QUERY], kind="query"), minilm_bf16_engine.embed([QUERY], kind="query"))


def test_get_engine_with_base_url_is_remote_and_shared(servers, minilm):
    engine = get_engine(minilm, base_url=servers["minilm-a"].url, api_key=API_KEY, device="cpu", dtype="float32")
    assert isinstance(engine.engine, RemoteEngine)
    assert (
        get_engine(
            minilm,
            base_url=servers["minilm-a"].url,
            api_key=API_KEY,
            device="cpu",
            dtype="float32",
            timeout=5,
            truncate="start",
        ).engine
        is engine.engine
    )  # per-call settings share the client


def test_api_key_required_and_never_shown(servers, minilm, caplog):
    import httpx

    caplog.set_level(logging.DEBUG)
    url = servers["minilm-a"].url
    # vLLM guards only /v1-style prefixes; its unprefixed model routes must not answer without the key either.
    for route in ("/score", "/rerank", "/classify", "/pooling", "/tokenize", "/v1/embeddings", "/openapi.json"):
        answer = (
            httpx.get(url + route)
            if route == "/openapi.json"
            else httpx.post(url + route, json={"model": str(minilm), "input": "x"})
        )
        assert answer.status_code == 401, route
    assert httpx.get(url + "/health").status_code == 200
    with RemoteEngine(minilm, base_url=servers["minilm-a"].url, api_key=None) as anonymous:
        with pytest.raises(RemoteAuthError, match=r"HTTP 401.*set api_key"):
            anonymous.embed(["x"])
    with _remote(minilm, servers["minilm-a"].url) as remote:
        assert remote.embed(["x"]).shape == (1, 384)
        assert API_KEY not in repr(remote)
    assert API_KEY not in caplog.text
    assert API_KEY not in servers["minilm-a"].log.read_text(errors="replace")


def test_framework_classes_in_remote_mode_equal_local(servers, minilm, minilm_engine, tiny_models):
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from langchain_rbln import RBLNEmbeddings, RBLNReranker
    from llama_index.embeddings.rbln import RBLNEmbedding
    from llama_index.postprocessor.rbln_rerank import RBLNReranker as NodeReranker

    texts = mixed_length(12)
    remote = {"base_url": servers["minilm-a"].url, "api_key": API_KEY}
    lc = RBLNEmbeddings(model=str(minilm), **remote)
    np.testing.assert_allclose(lc.embed_documents(texts), minilm_engine.embed(texts), atol=1e-5)
    np.testing.assert_allclose(lc.embed_query(QUERY), minilm_engine.embed([QUERY], kind="query")[0], atol=1e-5)
    li = RBLNEmbedding(model_name=str(minilm), **remote)
    np.testing.assert_allclose(li.get_text_embedding_batch(texts), minilm_engine.embed(texts), atol=1e-5)

    path = tiny_models["bert-cross-encoder"]
    local_scores = PoolingEngine.shared(path, device="cpu", dtype="float32").score(QUERY, texts[:8])
    reranked = RBLNReranker(
        model=str(path), top_n=None, base_url=servers["bert-cross-encoder"].url, api_key=API_KEY
    ).compress_documents([Document(page_content=t) for t in texts[:8]], QUERY)
    assert sorted(d.metadata["relevance_score"] for d in reranked) == pytest.approx(sorted(local_scores), abs=1e-5)
    nodes = [NodeWithScore(node=TextNode(text=t)) for t in texts[:8]]
    ranked = NodeReranker(
        model=str(path), top_n=8, base_url=servers["bert-cross-encoder"].url, api_key=API_KEY
    ).postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))
    assert sorted(n.score for n in ranked) == pytest.approx(sorted(local_scores), abs=1e-5)


def test_a_replica_killed_mid_ingest_loses_nothing(servers, minilm, minilm_engine, monkeypatch):
    """Replica b's engine is stopped before the ingest, so the first batch the client sends it stays in flight; b is
    killed only once that has happened: the lost batch is always one the client is waiting for."""
    import httpx

    texts = (passages(min_words=3) * 2)[:2000]
    expected = minilm_engine.embed(texts)
    victim = servers["minilm-b"]
    sent_to_victim = threading.Event()
    send = httpx.AsyncClient.send

    async def recorded(self, request, *args, **kwargs):
        if request.url.port == victim.port and request.url.path.endswith("/embeddings"):
            sent_to_victim.set()
        return await send(self, request, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "send", recorded)
    result = {}
    with _remote(minilm, servers["minilm-a"].url, victim.url, batch_size=16, timeout=900) as remote:
        worker = threading.Thread(target=lambda: result.setdefault("vectors", remote.embed(texts)))
        with victim.stalled(resume=False):
            worker.start()
            assert sent_to_victim.wait(timeout=900), "the client never sent a batch to replica b"
            victim.kill()
        worker.join(timeout=900)
    assert not worker.is_alive()
    vectors = result["vectors"]
    assert vectors.shape == expected.shape
    np.testing.assert_allclose(vectors, expected, atol=1e-5)


def test_the_server_describes_its_model_behind_the_api_key(servers, tiny_models):
    import httpx

    from rbln_retrieval.remote import DESCRIBE_PATH

    url = servers["qwen3-reranker"].url + DESCRIBE_PATH
    assert httpx.get(url).status_code == 401
    described = httpx.get(url, headers={"Authorization": f"Bearer {API_KEY}"}).json()
    family = described["family"]
    assert family["name"] == "qwen3-reranker" and family["default_instruction"]
    assert (
        family["max_length"]
        == PoolingEngine.shared(tiny_models["qwen3-reranker"], device="cpu", dtype="float32").family.tokens.max_length
    )


@pytest.mark.parametrize("name", ["qwen3-embedding", "qwen3-reranker", "bert-cross-encoder"])
def test_a_client_with_only_the_model_name_scores_like_local(servers, tiny_models, name):
    """No model files on the client: the family, prompts and templates come from the server's description."""
    local = PoolingEngine.shared(tiny_models[name], device="cpu", dtype="float32")
    docs = [p for p in passages(min_words=3) if len(p.split()) < 150][:20]
    with _remote(f"/nowhere/{name}", servers[name].url) as remote:
        assert remote.family == local.family
        differences = [np.abs(np.subtract(remote.score(QUERY, docs), local.score(QUERY, docs))).max()]
        if name == "qwen3-embedding":
            for kwargs in ({"kind": "query"}, {"kind": "query", "instruction": "Find Python docs"}, {}):
                differences.append(np.abs(remote.embed([QUERY], **kwargs) - local.embed([QUERY], **kwargs)).max())
    print(f"{name}: remote vs local max abs difference {max(differences):.2e}")
    assert max(differences) <= 1e-5


def test_an_explicit_family_that_contradicts_the_server_is_an_error(servers):
    with _remote("bge-reranker-base", servers["bert-cross-encoder"].url, family="bi-encoder") as remote:
        with pytest.raises(
            ValueError,
            match="family='bi-encoder' was requested, but the server serves bge-reranker-base as 'cross-encoder'",
        ):
            remote.score(QUERY, ["a"])
    with _remote("bge-reranker-base", servers["bert-cross-encoder"].url, family="cross-encoder") as remote:
        assert len(remote.score(QUERY, ["a"])) == 1


def test_framework_rerankers_with_only_the_model_name_equal_local(servers, tiny_models):
    from langchain_core.documents import Document
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    from langchain_rbln import RBLNReranker
    from llama_index.postprocessor.rbln_rerank import RBLNReranker as NodeReranker

    texts = mixed_length(8)
    for name in ("qwen3-reranker", "bert-cross-encoder"):
        expected = sorted(PoolingEngine.shared(tiny_models[name], device="cpu", dtype="float32").score(QUERY, texts))
        remote = {"base_url": servers[name].url, "api_key": API_KEY, "top_n": None}
        with RBLNReranker(model="bge-reranker-base", **remote) as lc:
            scores = [
                d.metadata["relevance_score"]
                for d in lc.compress_documents([Document(page_content=t) for t in texts], QUERY)
            ]
        assert sorted(scores) == pytest.approx(expected, abs=1e-5)
        with NodeReranker(model="bge-reranker-base", **remote) as li:
            ranked = li.postprocess_nodes(
                [NodeWithScore(node=TextNode(text=t)) for t in texts], query_bundle=QueryBundle(QUERY)
            )
        assert sorted(n.score for n in ranked) == pytest.approx(expected, abs=1e-5)


def test_remote_lone_surrogates_and_mappings(servers, minilm, minilm_engine):
    with _remote(minilm, servers["minilm-a"].url) as remote:
        np.testing.assert_allclose(remote.embed(["caf\udcff"]), minilm_engine.embed(["caf\ufffd"]), atol=1e-5)
        with pytest.raises(TypeError, match="not a dict"):
            remote.embed({"a": "b"})


def test_a_forked_child_reconnects_the_remote_client(servers, minilm, minilm_engine):
    from forking import run_in_child

    remote = get_engine(minilm, base_url=servers["minilm-a"].url, api_key=API_KEY)
    remote.embed(["warm"])  # the parent's loop and connections exist when the child forks
    result = run_in_child("fork", _embed_forked, remote.engine, deadline=60)
    assert result[0] == "ok", result
    np.testing.assert_allclose(result[1], minilm_engine.embed(["forked"])[0], atol=1e-5)


def _embed_forked(remote) -> list[float]:
    return remote.embed(["forked"])[0].tolist()
