"""Every supported family against a plain-transformers reference (fp32, max abs diff <= 1e-4)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import reference
from corpus import mixed_length
from model_builders import build_modernbert, build_nomic

from rbln_retrieval import ModelNotSupportedError, PoolingEngine, detect_family
from rbln_retrieval.prompts import QWEN3_DEFAULT_TASK

TEXTS = mixed_length(40)
QUERY = "How are exceptions raised and handled in Python?"
BI_ENCODERS = {"bert-cls": "CLS", "roberta-mean": "MEAN", "xlm-roberta-mean": "MEAN"}
CROSS_ENCODERS = ["bert-cross-encoder", "xlm-roberta-cross-encoder"]


def _engine(path) -> PoolingEngine:
    return PoolingEngine.shared(path, device="cpu", dtype="float32")


@pytest.mark.parametrize("name", list(BI_ENCODERS))
def test_bi_encoder_matches_reference(tiny_models, name):
    path = tiny_models[name]
    engine = _engine(path)
    assert engine.family.pooling == BI_ENCODERS[name]
    ours = engine.embed(TEXTS)
    expected = reference.embed(str(path), TEXTS, pooling=BI_ENCODERS[name], max_length=512)
    assert np.abs(ours - expected).max() <= 1e-4
    scores = engine.score(QUERY, TEXTS[:5])
    assert scores == pytest.approx(
        list(expected[:5] @ reference.embed(str(path), [QUERY], pooling=BI_ENCODERS[name], max_length=512)[0]), abs=1e-4
    )
    engine.close()


@pytest.mark.parametrize("name", CROSS_ENCODERS)
def test_cross_encoder_matches_reference(tiny_models, name):
    path = tiny_models[name]
    engine = _engine(path)
    ours = engine.score(QUERY, TEXTS)
    expected = reference.cross_encoder_scores(str(path), QUERY, TEXTS, max_length=512)
    assert np.abs(np.array(ours) - expected).max() <= 1e-4
    top = engine.rerank(QUERY, TEXTS, top_n=3)
    assert [i for i, _ in top] == [i for i, _ in sorted(enumerate(ours), key=lambda p: -p[1])[:3]]
    assert [s for _, s in top] == pytest.approx(sorted(ours, reverse=True)[:3], abs=1e-6)
    with pytest.raises(ValueError, match="cannot embed"):
        engine.embed(["a"])
    with pytest.raises(ValueError, match="takes no instruction"):
        engine.score(QUERY, ["a"], instruction="Judge relevance")
    engine.close()


@pytest.fixture(scope="module")
def qwen3_embedding(tiny_models):
    engine = _engine(tiny_models["qwen3-embedding"])
    yield tiny_models["qwen3-embedding"], engine
    engine.close()


def test_qwen3_embedding_documents_are_plain_and_queries_carry_the_instruction(qwen3_embedding):
    path, engine = qwen3_embedding
    docs = engine.embed(TEXTS)
    assert np.abs(docs - reference.embed(str(path), TEXTS, pooling="LAST", max_length=512)).max() <= 1e-4
    queries = engine.embed([QUERY], kind="query")
    prefix = f"Instruct: {QWEN3_DEFAULT_TASK}\nQuery:"
    expected = reference.embed(str(path), [QUERY], pooling="LAST", max_length=512, prefix=prefix)
    assert np.abs(queries - expected).max() <= 1e-4
    assert np.abs(queries - engine.embed([QUERY])).max() > 1e-3, "a query must differ from the same text as document"
    custom = engine.embed([QUERY], kind="query", instruction="Find Python documentation")
    expected = reference.embed(
        str(path), [QUERY], pooling="LAST", max_length=512, prefix="Instruct: Find Python documentation\nQuery:"
    )
    assert np.abs(custom - expected).max() <= 1e-4


def test_qwen3_embedding_matryoshka_dimensions(qwen3_embedding):
    path, engine = qwen3_embedding
    small = engine.embed(TEXTS[:8], dimensions=16)
    assert small.shape == (8, 16)
    expected = reference.embed(str(path), TEXTS[:8], pooling="LAST", max_length=512, dimensions=16)
    assert np.abs(small - expected).max() <= 1e-4
    np.testing.assert_allclose(np.linalg.norm(small, axis=1), 1.0, atol=1e-5)
    assert engine.embed([], dimensions=16).shape == (0, 16)
    for bad in (0, -3, 65):
        with pytest.raises(ValueError, match="dimensions"):
            engine.embed(["a"], dimensions=bad)


def test_dimensions_on_a_model_without_matryoshka_is_rejected(minilm_engine):
    with pytest.raises(ValueError, match="does not support matryoshka"):
        minilm_engine.embed(["a"], dimensions=128)


def test_qwen3_reranker_is_p_yes_with_its_templates(tiny_models):
    path = tiny_models["qwen3-reranker"]
    engine = _engine(path)
    assert engine.family.name == "qwen3-reranker"
    ours = engine.score(QUERY, TEXTS)
    expected = reference.qwen3_reranker_scores(str(path), QUERY, TEXTS, instruction=QWEN3_DEFAULT_TASK, max_length=512)
    assert np.abs(np.array(ours) - expected).max() <= 1e-4
    custom = engine.score(QUERY, TEXTS[:5], instruction="Judge whether the text is about Python")
    expected = reference.qwen3_reranker_scores(
        str(path), QUERY, TEXTS[:5], instruction="Judge whether the text is about Python", max_length=512
    )
    assert np.abs(np.array(custom) - expected).max() <= 1e-4
    assert np.abs(np.array(custom) - ours[:5]).max() > 1e-6, "the instruction must reach the model"
    engine.close()


NOMIC_PROMPTS = {"query": "search_query: ", "document": "search_document: "}


def test_modernbert_detection_reads_pooling_prompts_and_length(tiny_models, tmp_path):
    """gte-modernbert-base's layout (CLS, no prompts), its reranker, and modernbert-embed-base's (mean pooling,
    prompts and a sequence limit below the position table's from the sentence-transformers files)."""
    gte = detect_family(tiny_models["modernbert-cls"])
    assert (gte.name, gte.architecture, gte.pooling, gte.normalize) == ("bi-encoder", "ModernBertModel", "CLS", True)
    assert (gte.query_prompt, gte.document_prompt, gte.max_length, gte.uses_token_type_ids) == ("", "", 512, False)
    reranker = detect_family(tiny_models["modernbert-cross-encoder"])
    assert (reranker.name, reranker.architecture) == ("cross-encoder", "ModernBertForSequenceClassification")
    assert not reranker.uses_token_type_ids
    nomic = detect_family(build_modernbert(tmp_path / "nomic", pooling="mean", prompts=NOMIC_PROMPTS, max_length=256))
    assert (nomic.pooling, nomic.max_length) == ("MEAN", 256)
    assert (nomic.query_prompt, nomic.document_prompt) == ("search_query: ", "search_document: ")


def test_modernbert_prompts_reach_the_windowed_model(tmp_path):
    """Mean pooling and the checkpoint's prompts through the default engine; most texts outrun the local layers'
    window."""
    path = build_modernbert(tmp_path / "nomic", pooling="mean", prompts=NOMIC_PROMPTS)
    engine = _engine(path)
    documents = engine.embed(TEXTS)
    expected = reference.embed(str(path), TEXTS, pooling="MEAN", max_length=512, prefix="search_document: ")
    assert np.abs(documents - expected).max() <= 1e-4
    queries = engine.embed([QUERY], kind="query")
    expected = reference.embed(str(path), [QUERY], pooling="MEAN", max_length=512, prefix="search_query: ")
    assert np.abs(queries - expected).max() <= 1e-4
    assert np.abs(queries - engine.embed([QUERY])).max() > 1e-3, "a query must differ from the same text as document"
    engine.close()


# -- remote-code families: GTE-new and Nomic -------------------------------------------------------------------
def test_remote_code_families_are_detected_from_their_config(tiny_models):
    gte, nomic = detect_family(tiny_models["gte-new"]), detect_family(tiny_models["nomic"])
    assert (gte.name, gte.pooling, gte.query_prompt, gte.document_prompt, gte.matryoshka) == (
        "gte-new",
        "CLS",
        "",
        "",
        False,
    )
    assert gte.hf_overrides == {"architectures": ["GteNewModel"]} and gte.config_code == "configuration.NewConfig"
    assert (nomic.name, nomic.pooling, nomic.query_prompt, nomic.document_prompt, nomic.matryoshka) == (
        "nomic",
        "MEAN",
        "search_query: ",
        "search_document: ",
        True,
    )
    # GPT-2 field names: n_embd, n_positions.
    assert (nomic.hidden_size, nomic.max_length, nomic.hf_overrides) == (64, 512, {"is_matryoshka": True})


def test_nomic_uses_the_checkpoints_own_prompts(tmp_path):
    path = build_nomic(tmp_path / "nomic", prompts={"query": "query: ", "document": "passage: "})
    family = detect_family(path)
    assert (family.query_prompt, family.document_prompt) == ("query: ", "passage: ")


@pytest.mark.parametrize("name", ["gte-new", "nomic"])
def test_a_remote_code_family_without_trust_remote_code_is_one_sentence(tiny_models, name):
    path = tiny_models[name]
    with pytest.raises(ModelNotSupportedError) as raised:
        PoolingEngine(path, device="cpu", dtype="float32")
    message = str(raised.value)
    assert "\n" not in message and message.endswith("pass trust_remote_code=True if you trust its source.")
    assert message.startswith(f"{path} is a {detect_family(path).architecture} checkpoint ({name})")


def test_a_remote_code_family_missing_its_config_code_is_one_sentence(tiny_models, tmp_path):
    shutil.copytree(tiny_models["gte-new"], tmp_path / "gte", ignore=shutil.ignore_patterns("configuration.py"))
    with pytest.raises(ModelNotSupportedError) as raised:
        PoolingEngine(tmp_path / "gte", device="cpu", dtype="float32", trust_remote_code=True)
    assert str(raised.value) == (
        f"{tmp_path / 'gte'} names its config class configuration.NewConfig, but configuration.py is not in the "
        "directory."
    )


@pytest.fixture(scope="module")
def nomic(tiny_models):
    engine = PoolingEngine.shared(tiny_models["nomic"], device="cpu", dtype="float32", trust_remote_code=True)
    yield tiny_models["nomic"], engine
    engine.close()


def test_nomic_prefixes_queries_and_documents_with_its_task_prefixes(nomic):
    path, engine = nomic
    docs, queries = engine.embed(TEXTS), engine.embed([QUERY], kind="query")
    expected = reference.embed(str(path), TEXTS, pooling="MEAN", max_length=512, prefix="search_document: ")
    assert np.abs(docs - expected).max() <= 1e-4
    expected = reference.embed(str(path), [QUERY], pooling="MEAN", max_length=512, prefix="search_query: ")
    assert np.abs(queries - expected).max() <= 1e-4
    assert np.abs(queries - engine.embed([QUERY])).max() > 1e-3, "a query must differ from the same text as document"
    custom = engine.embed([QUERY], kind="query", instruction="clustering: ")
    expected = reference.embed(str(path), [QUERY], pooling="MEAN", max_length=512, prefix="clustering: ")
    assert np.abs(custom - expected).max() <= 1e-4


def test_nomic_matryoshka_truncates_then_normalizes_as_vllm_does(nomic):
    """vLLM's order (sentence-transformers' too): pool, truncate, normalize; nomic's model card puts a layer_norm
    before the truncation, which callers apply to normalize=False vectors themselves (README)."""
    path, engine = nomic
    small = engine.embed(TEXTS[:8], dimensions=16)
    expected = reference.embed(
        str(path), TEXTS[:8], pooling="MEAN", max_length=512, prefix="search_document: ", dimensions=16
    )
    assert small.shape == (8, 16) and np.abs(small - expected).max() <= 1e-4
    raw = engine.embed(TEXTS[:8], normalize=False)
    unnormalized = reference.embed(
        str(path), TEXTS[:8], pooling="MEAN", max_length=512, prefix="search_document: ", normalize=False
    )
    assert np.abs(raw - unnormalized).max() <= 1e-4 * np.abs(unnormalized).max()
    with pytest.raises(ValueError, match="dimensions"):
        engine.embed(["a"], dimensions=65)
