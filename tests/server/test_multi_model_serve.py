"""`rbln-retrieval serve` of several models: an embedder (bge-m3, which gives dense, sparse and token vectors), a
cross-encoder and a SPLADE model (tiny random-weight ones) behind one server start. Every dialect's routes dispatch
by the request's ``model`` (a rerank without one goes to the only reranker) and answer what each model's local
engine answers; /v1/models and the description list the three, each with the options and limits of its entry (the
server is started from config entries, as `serve --config` reads them: a request over the reranker's own limit is
refused naming it while the embedder answers); RemoteEngine and the framework classes pick their model on the
server by ``model``, and RemoteEngine gets sparse and token vectors from the server's outputs route and scores with
them as the local engines do; a model that cannot be served stops `serve` before any engine starts, in one sentence
naming it; a config file's bad fields are refused one sentence each, and docs/serving.md's config file is valid;
/metrics counts each model's requests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from servers import Server

from rbln_retrieval import PoolingEngine, get_engine
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, OUTPUTS_PATH
from rbln_retrieval.server.config import read_config

pytestmark = pytest.mark.server

TEXTS = ["a cat sat on the mat", "stocks fell sharply today", "the weather is mild"]
QUERY = "a cat"
CPU = {"device": "cpu", "dtype": "float32"}
RERANKER_MAX_LENGTH = 64  # the reranker's entry's own option; the others take the model's limit
RERANKER_MAX_CHARS = 200  # the reranker's entry's own limit; the others take the server's
DOCS = Path(__file__).resolve().parents[2] / "docs" / "serving.md"


@pytest.fixture(scope="module")
def models(tiny_models) -> dict[str, str]:
    return {
        role: str(tiny_models[name])
        for role, name in (
            ("embedder", "bge-m3"),
            ("reranker", "bert-cross-encoder"),
            ("splade", "splade"),
        )
    }


@pytest.fixture(scope="module")
def local(models):
    """Each model's local engine, as the server runs it (float32, CPU)."""
    engines = {
        "embedder": PoolingEngine.shared(models["embedder"], **CPU),
        "reranker": PoolingEngine.shared(models["reranker"], **CPU),
        "splade": PoolingEngine.shared(models["splade"], **CPU),
    }
    yield engines
    for engine in engines.values():
        engine.close()


@pytest.fixture(scope="module")
def server(models, tmp_path_factory):
    entries = [{"model": path} for path in models.values()]
    entries[1].update(max_length=RERANKER_MAX_LENGTH, max_input_chars=RERANKER_MAX_CHARS)
    server = Server(entries, tmp_path_factory.mktemp("multi") / "serve.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_the_models_are_listed_and_described(server, models):
    listed = httpx.get(server.url + "/v1/models", timeout=60).json()
    assert [row["id"] for row in listed["data"]] == list(models.values())
    described = httpx.get(server.url + DESCRIBE_PATH, timeout=60).json()
    assert [d["model"] for d in described["models"]] == list(models.values())
    assert [d["family"]["name"] for d in described["models"]] == ["bge-m3", "cross-encoder", "splade"]
    limits = [d["family"]["max_length"] for d in described["models"]]
    assert limits[1] == RERANKER_MAX_LENGTH and limits[0] > RERANKER_MAX_LENGTH, "each model's own options"


def test_each_dialect_dispatches_by_model_to_that_models_engine(server, models, local):
    embedder, reranker, splade = models["embedder"], models["reranker"], models["splade"]
    want = local["embedder"].embed(TEXTS, instruction="")
    openai = _post(server, "/v1/embeddings", {"model": embedder, "input": TEXTS}).json()
    np.testing.assert_array_equal(np.array([r["embedding"] for r in openai["data"]], dtype=np.float32), want)
    assert openai["model"] == embedder
    cohere = _post(server, "/v2/embed", {"model": embedder, "texts": TEXTS, "input_type": "search_document"}).json()
    np.testing.assert_array_equal(
        np.array(cohere["embeddings"]["float"], dtype=np.float32), local["embedder"].embed(TEXTS)
    )

    scores = local["reranker"].score(QUERY, TEXTS)
    ranked = local["reranker"].rerank(QUERY, TEXTS)
    jina = _post(server, "/v1/rerank", {"model": reranker, "query": QUERY, "documents": TEXTS}).json()
    assert [(r["index"], r["relevance_score"]) for r in jina["results"]] == ranked
    cohere = _post(server, "/v2/rerank", {"model": reranker, "query": QUERY, "documents": TEXTS}).json()
    assert [(r["index"], r["relevance_score"]) for r in cohere["results"]] == ranked
    tei = _post(server, "/rerank", {"query": QUERY, "texts": TEXTS}).json()  # no model: the only reranker
    assert [(r["index"], r["score"]) for r in tei] == ranked
    score = _post(server, "/score", {"model": reranker, "queries": QUERY, "documents": TEXTS}).json()
    assert [row["score"] for row in score["data"]] == scores

    sparse = _post(server, OUTPUTS_PATH, {"model": splade, "input": TEXTS, "output": "sparse"}).json()
    for row, expected in zip(sparse["data"], local["splade"].embed(TEXTS, output="sparse"), strict=True):
        got = dict(zip(row["sparse"]["indices"], row["sparse"]["values"], strict=True))
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), "SPLADE's weights as its local engine gives them"


def test_a_request_that_names_no_model_or_the_wrong_one_is_refused_in_one_sentence(server, models):
    ambiguous = _post(server, "/embed", {"inputs": TEXTS})  # TEI: two models embed
    assert ambiguous.status_code in (400, 422), ambiguous.text
    assert "Several served models" in ambiguous.text and models["splade"] in ambiguous.text
    unknown = _post(server, "/v1/embeddings", {"model": "nobody/else", "input": TEXTS})
    assert unknown.status_code == 404 and "is not served here" in unknown.text
    reranker = _post(server, "/v1/embeddings", {"model": models["reranker"], "input": TEXTS})
    assert 400 <= reranker.status_code < 500 and "reranker" in reranker.text


def test_a_request_over_one_models_own_limit_is_refused_naming_it_while_the_others_answer(server, models):
    long = "word " * (RERANKER_MAX_CHARS // 5 + 1)
    refused = _post(server, "/v1/rerank", {"model": models["reranker"], "query": QUERY, "documents": [long]})
    assert refused.status_code == 413, refused.text
    assert refused.json()["error"]["message"] == (
        f"`documents[0]` is {len(long)} characters, over the model {models['reranker']}'s max_input_chars of "
        f"{RERANKER_MAX_CHARS}; shorten it (only the model's max length in tokens is kept of it) or split it."
    )
    assert _post(server, "/v1/embeddings", {"model": models["embedder"], "input": [long]}).status_code == 200
    described = {d["model"]: d["limits"] for d in httpx.get(server.url + DESCRIBE_PATH, timeout=60).json()["models"]}
    assert described[models["reranker"]]["max_input_chars"] == RERANKER_MAX_CHARS, "its clients split under it"
    assert described[models["embedder"]]["max_input_chars"] > RERANKER_MAX_CHARS


def test_remote_engines_and_framework_classes_pick_their_model_by_name(server, models, local):
    from langchain_rbln import RBLNEmbeddings
    from llama_index.postprocessor.rbln_rerank import RBLNReranker

    with get_engine(models["embedder"], base_url=server.url) as remote:
        np.testing.assert_array_equal(remote.embed(TEXTS), local["embedder"].embed(TEXTS))
    with get_engine(models["reranker"], base_url=server.url) as remote:
        assert remote.rerank(QUERY, TEXTS) == local["reranker"].rerank(QUERY, TEXTS)
    with get_engine(models["splade"], base_url=server.url) as remote:  # its own description of the three
        assert (remote.family.name, remote.dimension) == ("splade", local["splade"].dimension)
    embeddings = RBLNEmbeddings(model=models["embedder"], base_url=server.url)
    assert embeddings.embed_documents(TEXTS) == local["embedder"].embed(TEXTS).tolist()
    from llama_index.core.schema import NodeWithScore, TextNode

    nodes = [NodeWithScore(node=TextNode(text=text), score=0.0) for text in TEXTS]
    best = RBLNReranker(model=models["reranker"], base_url=server.url, top_n=1).postprocess_nodes(
        nodes, query_str=QUERY
    )
    index, score = local["reranker"].rerank(QUERY, TEXTS)[0]
    assert (best[0].node.get_content(), best[0].score) == (TEXTS[index], pytest.approx(score, abs=0))
    with pytest.raises(Exception, match=r"serves .* not .*; pass one of them as the model"):
        get_engine("/no/such/model", base_url=server.url, family="bi-encoder").embed(TEXTS)


def test_metrics_count_each_models_requests_and_latencies(server, models):
    """/metrics labels the server's request counter and latency histogram by the model that answered, its route
    and status; a request no model answered (an unknown model) is labeled with none."""
    asked = {
        models["embedder"]: ("/v1/embeddings", {"input": TEXTS}),
        models["reranker"]: ("/v1/rerank", {"query": QUERY, "documents": TEXTS}),
        models["splade"]: (OUTPUTS_PATH, {"input": TEXTS, "output": "sparse"}),
    }
    for model, (route, body) in asked.items():
        assert _post(server, route, {"model": model, **body}).status_code == 200
    _post(server, "/v1/embeddings", {"model": "nobody", "input": TEXTS})
    text = httpx.get(server.url + "/metrics", timeout=60).text
    for model, (route, _) in asked.items():
        labels = re.escape(f'model="{model}",route="{route}",status="200"')
        assert re.search(rf"^rbln_retrieval_requests_total\{{{labels}\}} [1-9]", text, re.M), model
        assert re.search(rf"^rbln_retrieval_request_seconds_count\{{{labels}\}} [1-9]", text, re.M), model
    assert re.search(
        r'^rbln_retrieval_requests_total\{model="",route="/v1/embeddings",status="404"\} [1-9]', text, re.M
    )


def test_remote_engines_get_sparse_and_token_vectors_and_score_with_them(server, models, local):
    """The server's outputs route gives what vLLM's own server cannot (one pooling task per model): SPLADE's sparse
    vectors and bge-m3's three outputs from one request, as the local engines give them, with the query prompt put
    in by the client; and scores from them (SPLADE's sparse dot product, bge-m3's MaxSim) equal the local ones."""

    def assert_sparse_equal(got, want):
        for row, expected in zip(got, want, strict=True):
            assert row == pytest.approx(expected, rel=1e-5, abs=1e-6)

    splade, m3 = local["splade"], local["embedder"]
    with get_engine(models["splade"], base_url=server.url) as remote:
        assert_sparse_equal(remote.embed(TEXTS, output="sparse"), splade.embed(TEXTS, output="sparse"))
        assert_sparse_equal(
            remote.embed([QUERY], output="sparse", kind="query"), splade.embed([QUERY], output="sparse", kind="query")
        )
        assert remote.score(QUERY, TEXTS) == pytest.approx(splade.score(QUERY, TEXTS), rel=1e-5, abs=1e-6)
        assert remote.embed([], output="sparse") == []
    outputs = ["dense", "sparse", "multi_vector"]
    with get_engine(models["embedder"], base_url=server.url) as remote:
        got, want = remote.embed(TEXTS, output=outputs), m3.embed(TEXTS, output=outputs)
        np.testing.assert_allclose(got["dense"], want["dense"], atol=1e-6, rtol=0)
        assert_sparse_equal(got["sparse"], want["sparse"])
        for row, expected in zip(got["multi_vector"], want["multi_vector"], strict=True):
            np.testing.assert_allclose(row, expected, atol=1e-6, rtol=0)
        by_maxsim = remote.score(QUERY, TEXTS, output="multi_vector")
        assert by_maxsim == pytest.approx(m3.score(QUERY, TEXTS, output="multi_vector"), abs=1e-5)
        with pytest.raises(ValueError, match="dimensions applies to dense vectors only"):
            remote.embed(TEXTS, output="sparse", dimensions=8)
    # The framework classes given the server's URL: LangChain's sparse embeddings and late-interaction reranker.
    from langchain_rbln import RBLNReranker, RBLNSparseEmbeddings

    sparse = RBLNSparseEmbeddings(model=models["embedder"], base_url=server.url).embed_documents(TEXTS)
    assert_sparse_equal([dict(zip(v.indices, v.values, strict=True)) for v in sparse], want["sparse"])
    reranker = RBLNReranker(model=models["embedder"], base_url=server.url, late_interaction=True, top_n=None)
    ranked = [(row["index"], row["relevance_score"]) for row in reranker.rerank(TEXTS, QUERY)]
    expected = m3.rerank(QUERY, TEXTS, output="multi_vector")
    assert [i for i, _ in ranked] == [i for i, _ in expected]
    assert [s for _, s in ranked] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_a_model_that_cannot_be_served_stops_serve_naming_it(models, tmp_path):
    """`rbln-retrieval serve --config models.toml` as docs/serving.md writes it, listing a good model and then a
    broken copy of it (its weights file cut short): serve stops in one sentence naming the broken one, before the
    good one's engine starts."""
    broken = tmp_path / "broken-model"
    shutil.copytree(models["embedder"], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    config = tmp_path / "models.toml"
    config.write_text(f'[[models]]\nmodel = "{models["embedder"]}"\n\n[[models]]\nmodel = "{broken}"\n')
    done = subprocess.run(
        [Path(sys.executable).parent / "rbln-retrieval", "serve", "--config", str(config), "--device", "cpu"],
        capture_output=True,
        text=True,
        env={**os.environ},
        timeout=600,
    )
    assert done.returncode == 1, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("rbln-retrieval: error:")]
    assert f"{broken} cannot be served: model.safetensors is not a readable safetensors file" in line, line


def test_a_config_files_bad_fields_are_refused_one_sentence_each(tmp_path):
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nmodel = "m"\ndtype = "float16"\nnpus = [-1]\nbatch = 3\n\n[[models]]\n')
    with pytest.raises(ValueError) as error:
        read_config(config)
    assert str(error.value).splitlines() == [
        f"{config}, model 1: dtype='float16' is refused: Input should be 'auto', 'float32' or 'bfloat16'.",
        f"{config}, model 1: npus.0=-1 is refused: Input should be greater than or equal to 0.",
        f"{config}, model 1: batch is not an option of a served model (those are: allow_pickle, cache_folder, "
        "device, dtype, engine_kwargs, family, max_concurrent_requests, max_input_chars, max_inputs_per_request, "
        "max_length, max_payload_bytes, max_queued_tokens, model, npus, revision, trust_remote_code).",
        f"{config}, model 2: model is missing; every model needs one.",
    ]
    config.write_text('models = "m"\n')
    with pytest.raises(ValueError, match=r"lists no model: give one \[\[models\]\] table a model"):
        read_config(config)


def test_the_documented_config_file_is_valid(tmp_path):
    (block,) = re.findall(r"<!-- config: models.toml .*?-->\n```toml\n(.*?)```", DOCS.read_text(), re.S)
    config = tmp_path / "models.toml"
    config.write_text(block)
    entries = read_config(config)
    assert [entry.model for entry in entries] == ["BAAI/bge-m3", "BAAI/bge-reranker-v2-m3", "naver/splade-v3"]
    assert entries[0].device_env() == {"RBLN_VISIBLE_DEVICES": "0"} and entries[2].device_env() == {}
    assert entries[1].options({"device": "cpu"}) == {"device": "cpu", "engine_kwargs": {"max_num_seqs": 32}}
