"""Bad input gets a defined result: a clear one-sentence error naming the item, or documented behaviour."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from rbln_retrieval import DeviceUnavailableError, ModelNotSupportedError, PoolingEngine, detect_family
from rbln_retrieval.backend.npu import rbln_runtime


def test_empty_list_returns_an_empty_matrix_without_touching_the_engine(minilm_engine, monkeypatch):
    monkeypatch.setattr(minilm_engine.engine, "_vllm", None)  # any engine call would now fail
    monkeypatch.setattr(minilm_engine.engine, "_start", None)
    out = minilm_engine.embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32
    assert minilm_engine.score("query", []) == []


def test_empty_and_whitespace_texts_get_valid_vectors(minilm_engine):
    out = minilm_engine.embed(["", "   ", "\n\t"])
    assert out.shape == (3, 384) and np.isfinite(out).all()
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("bad, name", [(None, "NoneType"), (3, "int"), (b"bytes", "bytes"), ({"a": 1}, "dict")])
def test_non_string_item_raises_type_error_naming_the_index(minilm_engine, bad, name):
    with pytest.raises(TypeError, match=rf"texts\[2\] is {name}, expected str"):
        minilm_engine.embed(["a", "b", bad])
    with pytest.raises(TypeError, match=rf"documents\[1\] is {name}, expected str"):
        minilm_engine.score("q", ["a", bad])


def test_a_single_string_instead_of_a_list_is_rejected(minilm_engine):
    with pytest.raises(TypeError, match="must be a list of strings"):
        minilm_engine.embed("hello")


def test_a_mapping_instead_of_a_list_is_refused(minilm_engine):
    with pytest.raises(TypeError, match=r"texts must be a list of strings, not a dict \(its keys would be embedded"):
        minilm_engine.embed({"doc-1": "Paris", "doc-2": "Berlin"})
    with pytest.raises(TypeError, match="documents must be a list of strings, not a dict"):
        minilm_engine.score("capital", {"doc-1": "Paris"})


LONE_SURROGATE = "caf\udcff menu"  # what errors="surrogateescape" leaves for the byte 0xff


def test_lone_surrogates_are_replaced_by_u_fffd(minilm_engine):
    """Documented choice (docs/reliability.md): each lone surrogate becomes U+FFFD, as decoding the bytes with
    errors="replace" would have made it; the rest of the batch is unaffected."""
    replaced = LONE_SURROGATE.replace("\udcff", "\ufffd")
    vectors = minilm_engine.embed(["before", LONE_SURROGATE, "after"])
    np.testing.assert_allclose(vectors, minilm_engine.embed(["before", replaced, "after"]), atol=1e-6)
    assert minilm_engine.score(LONE_SURROGATE, [LONE_SURROGATE]) == pytest.approx(
        minilm_engine.score(replaced, [replaced]), abs=1e-6
    )


def test_query_must_be_a_non_empty_string(minilm_engine):
    with pytest.raises(TypeError, match="query is NoneType"):
        minilm_engine.score(None, ["a"])
    with pytest.raises(ValueError, match="query is empty"):
        minilm_engine.rerank("  ", ["a"])


def test_unknown_kind_and_truncate_are_rejected(minilm, minilm_engine):
    with pytest.raises(ValueError, match="kind='passage'"):
        minilm_engine.embed(["a"], kind="passage")
    with pytest.raises(ValueError, match="truncate"):
        PoolingEngine(minilm, truncate="middle")


def test_missing_model_directory(tmp_path):
    with pytest.raises(ModelNotSupportedError, match=r"does not exist\.$"):
        PoolingEngine(tmp_path / "nope", device="cpu")


def test_unsupported_architecture_is_one_sentence(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "n_positions": 64}))
    with pytest.raises(ModelNotSupportedError, match="architecture 'GPT2LMHeadModel', which rbln-retrieval does not"):
        PoolingEngine(tmp_path, device="cpu")


def test_classifier_with_several_labels_is_not_a_reranker(tmp_path):
    config = {
        "architectures": ["BertForSequenceClassification"],
        "max_position_embeddings": 512,
        "id2label": {"0": "neg", "1": "pos"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelNotSupportedError, match="2 labels"):
        detect_family(tmp_path)


def test_device_rbln_without_the_runtime_says_what_to_install(minilm):
    assert not rbln_runtime.probe().installed, "this test documents the host without the RBLN runtime"
    with pytest.raises(DeviceUnavailableError, match=r"rebel-compiler.*torch-rbln.*Rebellions' package index"):
        PoolingEngine(minilm, device="rbln")


def test_max_length_outside_the_model_range(minilm):
    with pytest.raises(ValueError, match="max_length=100000 is outside"):
        PoolingEngine(minilm, max_length=100000)


def test_pickle_only_checkpoint_is_refused_unless_allowed(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], "max_position_embeddings": 64}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(ModelNotSupportedError, match=r"only pickle weights \(pytorch_model.bin\).*allow_pickle=True"):
        PoolingEngine(tmp_path, device="cpu")


@pytest.mark.parametrize(
    "output, name", [("sparse", "sparse"), ("multi_vector", "multi_vector"), (["dense", "sparse"], "sparse")]
)
def test_token_outputs_on_a_model_without_the_head_name_model_and_output(minilm, minilm_engine, output, name):
    """Sparse weights need bge-m3's sparse head, multi-vectors its ColBERT head; a pooled-only model has neither."""
    with pytest.raises(
        ValueError,
        match=rf"^{re.escape(str(minilm))} has no .* head \(family bi-encoder\), "
        rf"so it cannot give output='{name}'",
    ):
        minilm_engine.embed(["a"], output=output)


@pytest.mark.parametrize(
    "output, error, message",
    [
        ("colbert", ValueError, r"output='colbert' is not one of 'dense', 'sparse', 'multi_vector'"),
        ([], TypeError, "expected one of dense, sparse, multi_vector or a non-empty list"),
        (None, TypeError, "output is None"),
    ],
)
def test_unknown_outputs_are_refused(minilm_engine, output, error, message):
    with pytest.raises(error, match=message):
        minilm_engine.embed(["a"], output=output)
