"""SPLADE: detection of both checkpoint layouts, the sparse vectors against sentence-transformers' SparseEncoder
recipe written with plain transformers (stock and bundled runner; the rbln target in tests/backend/test_parity.py),
scoring by sparse dot product, and one sentence for each input SPLADE cannot take."""

from __future__ import annotations

import json
import shutil

import pytest
import reference
from corpus import mixed_length
from http_fakes import FakeServer
from model_builders import build_splade
from tolerances import FP32_SAME_KERNELS, assert_sparse_close

from rbln_retrieval import ModelNotSupportedError, PoolingEngine, detect_family
from rbln_retrieval.remote import RemoteEngine
from rbln_retrieval.results.outputs import sparse_dot

# A repeated word exercises "the largest weight per vocabulary id"; long texts are truncated at max_length.
TEXTS = ["the cat sat on the mat, the end", "", *mixed_length(20)]
QUERY = "Which passage talks about the weather in spring?"
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=["stock", "bundled"])
def splade(request, tiny_models):
    path = tiny_models["splade"]
    engine = PoolingEngine.shared(path, device="cpu", dtype="float32", runner=request.param)
    yield path, engine
    engine.close()


@pytest.fixture(scope="module")
def expected(tiny_models):
    return reference.splade(str(tiny_models["splade"]), TEXTS, max_length=512)


def test_both_layouts_are_detected(tiny_models, tmp_path):
    vocabulary = json.loads((tiny_models["splade"] / "config.json").read_text())["vocab_size"]
    with_st = detect_family(tiny_models["splade"])
    bare = detect_family(build_splade(tmp_path / "bare", sentence_transformers=False))
    for family in (with_st, bare):
        assert (family.name, family.graph.architecture, family.pool.hidden_size) == (
            "splade",
            "BertForMaskedLM",
            vocabulary,
        )
        assert family.graph.hf_overrides == {"architectures": ["RblnBertSpladeModel"]}
        assert not family.gives_dense and not family.late_interaction_only
    assert bare == with_st


def test_sparse_vectors_match_the_sparse_encoder_recipe(splade, expected):
    _, engine = splade
    ours = engine.embed(TEXTS, output="sparse")
    assert_sparse_close(ours, expected, TOLERANCE)
    assert all(list(d) == sorted(d) and all(type(t) is int and w > 0 for t, w in d.items()) for d in ours)
    assert min(len(d) for d in expected) > 50, "the test model must give many non-zero weights per text"
    # [CLS] and [SEP] count, as the attention mask keeps them: the empty text has weights from those two alone.
    assert ours[1]
    assert_sparse_close(engine.embed([""], output=["sparse"])["sparse"], [ours[1]], FP32_SAME_KERNELS)
    assert engine.embed([], output="sparse") == []
    # No query prompt in the files: a query is embedded as a document.
    assert_sparse_close(engine.embed(TEXTS[:3], kind="query", output="sparse"), ours[:3], FP32_SAME_KERNELS)


def test_scores_and_ranks_by_sparse_dot_product(splade, expected):
    _, engine = splade
    (query,) = reference.splade(str(splade[0]), [QUERY], max_length=512)
    want = [sparse_dot(query, d) for d in expected]
    assert engine.score(QUERY, TEXTS) == pytest.approx(want, rel=1e-5, abs=TOLERANCE)
    ranked = engine.rerank(QUERY, TEXTS, top_n=4)
    assert [i for i, _ in ranked] == sorted(range(len(TEXTS)), key=lambda i: -want[i])[:4]
    assert engine.score(QUERY, []) == []


def test_outputs_splade_lacks_are_refused_in_one_sentence(splade):
    path, engine = splade
    for output in ("dense", ["sparse", "dense"], "multi_vector"):
        name = output if isinstance(output, str) else "dense"
        with pytest.raises(ValueError, match=rf"is a SPLADE model: .* cannot give output='{name}'; ask for output"):
            engine.embed(["a"], output=output)
    with pytest.raises(ValueError, match=r"is a SPLADE model: .* cannot give output='dense'"):
        engine.embed(["a"])
    with pytest.raises(ValueError, match=r"is a SPLADE model: .* cannot give output='multi_vector'"):
        engine.score("q", ["a"], output="multi_vector")
    with pytest.raises(ValueError, match="dimensions applies to dense vectors only"):
        engine.embed(["a"], output="sparse", dimensions=8)
    with FakeServer("500") as server, RemoteEngine(str(path), base_url=server.url) as remote:
        with pytest.raises(ValueError, match=r"is a SPLADE model: .* cannot give output='dense'"):
            remote.embed(["a"])
        with pytest.raises(ValueError, match=r"output='sparse' .* is not served by this server"):
            remote.embed(["a"], output="sparse")
        with pytest.raises(ValueError, match=r"output='sparse' .* is not served by this server"):
            remote.score("q", ["a"])
    assert server.posts == []


def _edit(path, name, change):
    data = json.loads((path / name).read_text())
    change(data)
    (path / name).write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: _edit(d, "config.json", lambda c: c.update(architectures=["RobertaForMaskedLM"])),
            r"has architecture 'RobertaForMaskedLM'; rbln-retrieval runs SPLADE on BERT masked-LM checkpoints",
        ),
        (
            lambda d: _edit(d, "1_SpladePooling/config.json", lambda c: c.update(pooling_strategy="sum")),
            r"SpladePooling has pooling_strategy 'sum'; rbln-retrieval runs SPLADE's max pooling only",
        ),
        (
            lambda d: _edit(d, "1_SpladePooling/config.json", lambda c: c.update(activation_function="log1p_relu")),
            r"SpladePooling has activation_function 'log1p_relu'; rbln-retrieval runs log\(1 \+ relu\(logit\)\) only",
        ),
        (
            lambda d: _edit(d, "modules.json", lambda m: m.append({"type": "sentence_transformers.models.Router"})),
            r"modules include sentence_transformers.models.Router, which rbln-retrieval does not run for SPLADE",
        ),
        (
            lambda d: _edit(d, "modules.json", lambda m: m[1].update(type="sentence_transformers.models.Pooling")),
            r"is a BertForMaskedLM checkpoint whose sentence-transformers modules hold no SpladePooling module",
        ),
    ],
    ids=["roberta", "sum-pooling", "log1p-relu", "extra-module", "dense-pooling"],
)
def test_splade_checkpoints_vllm_cannot_run_are_refused_at_detection(tiny_models, tmp_path, change, message):
    model = tmp_path / "model"
    shutil.copytree(tiny_models["splade"], model)
    change(model)
    with pytest.raises(ModelNotSupportedError, match=message):
        detect_family(model)


def test_asking_for_splade_on_another_architecture_is_refused(tiny_models):
    with pytest.raises(ModelNotSupportedError, match=r"has architecture 'BertModel'; rbln-retrieval runs SPLADE"):
        detect_family(tiny_models["bert-cls"], family="splade")
