"""Every supported family against a plain-transformers reference (fp32, max abs diff <= 1e-4)."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from corpus import mixed_length

from rbln_retrieval import PoolingEngine
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


def test_colbert_gives_token_vectors_and_ranks_by_summed_maxsim(tiny_models):
    """An HF_ColBERT checkpoint: token vectors of the projection's width like the plain-torch reference, scores
    and rankings by MaxSim without asking for it, and one sentence for the outputs it has no head for."""
    path = tiny_models["colbert"]
    engine = _engine(path)
    assert (engine.family.name, engine.dimension) == ("colbert", 32)
    ours = engine.embed(TEXTS[:8], output="multi_vector")
    expected = reference.colbert(str(path), TEXTS[:8], max_length=512)
    assert [v.shape for v in ours] == [e.shape for e in expected]
    assert max(np.abs(a - b).max() for a, b in zip(ours, expected)) <= 1e-4
    (query,) = reference.colbert(str(path), [QUERY], max_length=512)
    want = [reference.colbert_maxsim(query, d) for d in expected]
    assert engine.score(QUERY, TEXTS[:8]) == pytest.approx(want, abs=1e-4)
    assert engine.score(QUERY, TEXTS[:8], output="multi_vector") == engine.score(QUERY, TEXTS[:8])
    assert [i for i, _ in engine.rerank(QUERY, TEXTS[:8], top_n=3)] == sorted(range(8), key=lambda i: -want[i])[:3]
    assert engine.score(QUERY, []) == []
    for output in ("dense", "sparse"):
        with pytest.raises(ValueError, match=rf"is a ColBERT model with no .* so it cannot give output='{output}'"):
            engine.embed(["a"], output=output)
    with pytest.raises(ValueError, match="cannot give output='dense'"):
        engine.embed(["a"])
    engine.close()


def test_colbert_checkpoints_vllm_cannot_run_as_colbert_are_refused_at_detection(tiny_models, tmp_path):
    """An HF_ColBERT directory without its projection, and a PyLate checkpoint (Dense module, [Q]/[D] prefixes,
    which a bi-encoder preset would silently mis-pool), each get one sentence."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from rbln_retrieval import ModelNotSupportedError, detect_family

    headless = tmp_path / "headless"
    shutil.copytree(tiny_models["colbert"], headless)
    weights = load_file(headless / "model.safetensors")
    del weights["linear.weight"]
    save_file(weights, headless / "model.safetensors")
    with pytest.raises(
        ModelNotSupportedError, match=r"HF_ColBERT checkpoint without its projection: no 'linear\.weight'"
    ):
        detect_family(headless)
    pylate = tmp_path / "pylate"
    shutil.copytree(tiny_models["bert-cls"], pylate)
    (pylate / "config_sentence_transformers.json").write_text(
        json.dumps({"query_prefix": "[Q] ", "document_prefix": "[D] ", "prompts": {}}), encoding="utf-8"
    )
    with pytest.raises(ModelNotSupportedError, match=r"is a PyLate ColBERT checkpoint .* does not support"):
        detect_family(pylate)
