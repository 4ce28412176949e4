"""The clients lane: each HTTP dialect's own client package, installed from PyPI (requirements/dev.txt) and run
unmodified against `rbln-retrieval serve`, gets the local engine's results: vectors within float32's cosine, scores
within float32 rounding, rankings identical. OpenAI's `openai`, Cohere's `cohere.ClientV2` and langchain-cohere,
TEI's `huggingface_hub.InferenceClient` and llama-index's `TextEmbeddingsInference`. The session's MiniLM server
(`minilm_server`, no prompts) and tiny cross-encoder server (`reranker_server`) answer them all; docs/serving.md's
table names these tests per row."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from tolerances import FP32_VS_REFERENCE, min_row_cosine

from rbln_retrieval import PoolingEngine, quantize_embeddings

pytestmark = pytest.mark.server

MIN_COSINE = 0.99999  # float32 on both sides, other batch shapes
SCORE_ATOL = 1e-5  # a probability or cosine from the same float32 kernels
UNUSED_KEY = "not-checked"  # the servers run without a key; every client insists on sending one
TEXTS = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog.",
    "Paris is the capital of France.",
    "Vectors of text let a search engine find passages by meaning.",
]
QUERY = "Which city is the capital of France?"
DOCUMENTS = [
    "Berlin is the capital of Germany.",
    "Paris is the capital and largest city of France.",
    "The Eiffel Tower is in Paris.",
    "Bananas are rich in potassium.",
    "France borders Spain, Italy and Germany.",
]


def served_model(server) -> str:
    """The one model id the server lists at GET /v1/models (what every client names)."""
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


@pytest.fixture(scope="module")
def minilm_id(minilm_server) -> str:
    return served_model(minilm_server)


@pytest.fixture(scope="module")
def reranker_id(reranker_server) -> str:
    return served_model(reranker_server)


@pytest.fixture(scope="module")
def reranker_engine(tiny_models):
    handle = PoolingEngine.shared(tiny_models["bert-cross-encoder"], device="cpu", dtype="float32")
    yield handle
    handle.close()


def assert_vectors(got, want) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape, f"{got.shape} vectors, the local engine gives {want.shape}"
    figure = min_row_cosine(got, want)
    assert figure >= MIN_COSINE, f"min cosine {figure:.7f} against the local engine"


def assert_ranking(got: list[tuple[int, float]], want: list[tuple[int, float]]) -> None:
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], atol=SCORE_ATOL)


# -- OpenAI --------------------------------------------------------------------------------------------------------
def test_openai_embeddings(minilm_server, minilm_id, minilm_engine):
    from openai import OpenAI

    client = OpenAI(base_url=minilm_server.url + "/v1", api_key=UNUSED_KEY, max_retries=0)
    assert [model.id for model in client.models.list()] == [minilm_id]
    response = client.embeddings.create(model=minilm_id, input=TEXTS)
    assert [item.index for item in response.data] == list(range(len(TEXTS)))
    assert_vectors([item.embedding for item in response.data], minilm_engine.embed(TEXTS))
    assert response.usage.prompt_tokens > 0
    floats = client.embeddings.create(model=minilm_id, input=TEXTS[0], encoding_format="float")
    assert_vectors([floats.data[0].embedding], minilm_engine.embed(TEXTS[:1]))


def test_openai_embeddings_of_token_ids(minilm_server, minilm_id, minilm_engine, minilm):
    """Token ids, as OpenAI's tokenizer-side clients send them (LangChain's OpenAIEmbeddings by default): the
    text's own ids give the text's vector."""
    from openai import OpenAI
    from transformers import AutoTokenizer

    client = OpenAI(base_url=minilm_server.url + "/v1", api_key=UNUSED_KEY, max_retries=0)
    ids = AutoTokenizer.from_pretrained(minilm)(TEXTS[:2])["input_ids"]
    tokens = client.embeddings.create(model=minilm_id, input=ids)
    assert_vectors([item.embedding for item in tokens.data], minilm_engine.embed(TEXTS[:2]))


# -- Cohere v2 -----------------------------------------------------------------------------------------------------
def cohere_client(server):
    import cohere

    return cohere.ClientV2(api_key=UNUSED_KEY, base_url=server.url, timeout=120)


@pytest.mark.parametrize("input_type", ["search_document", "search_query"])
def test_cohere_embed_on_a_model_without_prompts(input_type, minilm_server, minilm_id, minilm_engine):
    """Cohere's clients always send an input type; MiniLM has no prompts, so both give its plain vectors, in every
    embedding type the package quantizes to."""
    response = cohere_client(minilm_server).embed(
        model=minilm_id, texts=TEXTS, input_type=input_type, embedding_types=["float", "int8", "ubinary"]
    )
    want = minilm_engine.embed(TEXTS)
    assert_vectors(response.embeddings.float_, want)
    # ubinary: the sign bits packed big-endian (quantize_embeddings); a component within float32 noise of zero may
    # take either sign.
    got_bits = np.unpackbits(np.asarray(response.embeddings.ubinary, dtype=np.uint8), axis=1)[:, : want.shape[1]]
    want_bits = np.unpackbits(quantize_embeddings(want, "ubinary"), axis=1)[:, : want.shape[1]]
    differ = got_bits != want_bits
    assert not differ[np.abs(want) > FP32_VS_REFERENCE].any(), "ubinary bits differ from the local vectors' signs"
    # int8: docs/serving.md's 256 buckets over each dimension's [-1, 1]; float32 noise may cross one bucket edge.
    ranges = np.stack([-np.ones(want.shape[1]), np.ones(want.shape[1])]).astype(np.float32)
    int8 = np.asarray(response.embeddings.int8, dtype=np.int64)
    assert int8.shape == want.shape
    assert np.abs(int8 - quantize_embeddings(want, "int8", ranges=ranges)).max() <= 1
    assert response.meta.billed_units.input_tokens > 0
    assert response.texts == TEXTS


def test_cohere_rerank(reranker_server, reranker_id, reranker_engine):
    response = cohere_client(reranker_server).rerank(model=reranker_id, query=QUERY, documents=DOCUMENTS, top_n=3)
    got = [(r.index, r.relevance_score) for r in response.results]
    assert_ranking(got, reranker_engine.rerank(QUERY, DOCUMENTS, top_n=3))
    assert response.meta.billed_units.search_units >= 1


def test_langchain_cohere_embeddings(minilm_server, minilm_id, minilm_engine):
    from langchain_cohere import CohereEmbeddings

    embeddings = CohereEmbeddings(model=minilm_id, cohere_api_key=UNUSED_KEY, base_url=minilm_server.url)
    assert_vectors(embeddings.embed_documents(TEXTS), minilm_engine.embed(TEXTS))
    assert_vectors([embeddings.embed_query(QUERY)], minilm_engine.embed([QUERY]))


def test_langchain_cohere_rerank_sends_null_max_tokens_per_doc(reranker_server, reranker_id, reranker_engine):
    """CohereRerank sends ``"max_tokens_per_doc": null``: a 200 with the local engine's ranking."""
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(model=reranker_id, cohere_api_key=UNUSED_KEY, base_url=reranker_server.url, top_n=3)
    got = [(r["index"], r["relevance_score"]) for r in reranker.rerank(DOCUMENTS, QUERY)]
    want = reranker_engine.rerank(QUERY, DOCUMENTS, top_n=3)
    assert_ranking(got, want)
    kept = reranker.compress_documents([Document(page_content=d) for d in DOCUMENTS], QUERY)
    assert [d.page_content for d in kept] == [DOCUMENTS[i] for i, _ in want]


# -- TEI -----------------------------------------------------------------------------------------------------------
@pytest.fixture
def inference_client(monkeypatch):
    """huggingface_hub's InferenceClient for a server URL. The suite's HF_HUB_OFFLINE (its guard against the hub)
    also stops that client from reaching any URL at all; a user pointing it at their server has it unset, and a
    client given a base URL asks nothing of the hub."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return lambda server: InferenceClient(base_url=server.url, api_key=UNUSED_KEY, timeout=120)


def test_huggingface_hub_feature_extraction(minilm_server, minilm_engine, inference_client):
    """InferenceClient(base_url=...) posts to the server's root (TEI's dispatch by model type)."""
    client = inference_client(minilm_server)
    assert_vectors(client.feature_extraction(TEXTS), minilm_engine.embed(TEXTS))
    assert_vectors(client.feature_extraction(TEXTS[0]).reshape(1, -1), minilm_engine.embed(TEXTS[:1]))
    raw = client.feature_extraction(TEXTS, normalize=False)
    assert_vectors(raw, minilm_engine.embed(TEXTS, normalize=False))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_huggingface_hub_sentence_similarity(minilm_server, minilm_engine, inference_client):
    client = inference_client(minilm_server)
    got = client.sentence_similarity(QUERY, DOCUMENTS)
    np.testing.assert_allclose(got, minilm_engine.score(QUERY, DOCUMENTS), atol=SCORE_ATOL)


def test_huggingface_hub_text_classification_on_a_cross_encoder(reranker_server, tiny_models, inference_client):
    """One text through the cross-encoder's head: TEI's /predict, its one label with the sigmoid of the logit."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    client = inference_client(reranker_server)
    result = client.text_classification(TEXTS[2])
    labels = result if isinstance(result, list) else [result]
    path = tiny_models["bert-cross-encoder"]
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    with torch.no_grad():
        logit = model(**AutoTokenizer.from_pretrained(path)(TEXTS[2], return_tensors="pt")).logits[0, 0]
    assert [item.label for item in labels] == [model.config.id2label[0]]
    assert labels[0].score == pytest.approx(float(torch.sigmoid(logit)), abs=FP32_VS_REFERENCE)


def test_llama_index_text_embeddings_inference(minilm_server, minilm_id, minilm_engine):
    """llama-index's TEI class posts ``{"inputs": [...], "truncate": true}`` to /embed."""
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    embed_model = TextEmbeddingsInference(model_name=minilm_id, base_url=minilm_server.url, timeout=120)
    assert_vectors(embed_model.get_text_embedding_batch(TEXTS), minilm_engine.embed(TEXTS))
    assert_vectors([embed_model.get_query_embedding(QUERY)], minilm_engine.embed([QUERY]))


def test_llama_index_tei_rerank(reranker_server, reranker_id, reranker_engine):
    """llama-index's TEI rerank postprocessor posts ``{"query", "texts"}`` to /rerank and reorders the nodes."""
    from llama_index.core.schema import NodeWithScore, TextNode
    from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

    reranker = TextEmbeddingInference(model_name=reranker_id, base_url=reranker_server.url, top_n=3)
    nodes = [NodeWithScore(node=TextNode(text=document), score=0.0) for document in DOCUMENTS]
    kept = reranker.postprocess_nodes(nodes, query_str=QUERY)
    assert_ranking(
        [(DOCUMENTS.index(node.node.get_content()), node.score) for node in kept],
        reranker_engine.rerank(QUERY, DOCUMENTS, top_n=3),
    )


def test_the_route_tables_clients_column_names_tests_that_exist():
    """docs/serving.md's route table names, per row, the client and the test that judge it: each named test exists,
    and each test of this lane is named."""
    root = Path(__file__).resolve().parents[2]
    lines = (root / "docs" / "serving.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| dialect | route |"))
    rows = [line for line in itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])]
    assert lines[start].rstrip(" |").endswith("tested with") and rows
    named = set()
    for row in rows:
        cell = row.rstrip(" |").rsplit("|", 1)[1]
        tests = re.findall(r"`(test_\w+\.py)::(test_\w+)`", cell)
        assert tests, f"a route without a test that judges it: {row[:80]}"
        for file, name in tests:
            (path,) = (root / "tests").rglob(file)
            assert f"def {name}(" in path.read_text(encoding="utf-8"), f"{file}::{name}"
        named.update(name for file, name in tests if file == Path(__file__).name)
    lane = set(re.findall(r"^def (test_\w+)\(", Path(__file__).read_text(encoding="utf-8"), re.MULTILINE))
    assert lane - named == {"test_the_route_tables_clients_column_names_tests_that_exist"}
