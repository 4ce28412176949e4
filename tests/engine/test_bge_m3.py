"""bge-m3's three outputs (dense, sparse lexical weights, ColBERT multi-vectors) against FlagEmbedding's recipe
written with plain transformers, on the stock and the bundled runner."""

from __future__ import annotations

import numpy as np
import pytest
import reference
from corpus import mixed_length
from http_fakes import FakeServer
from tolerances import assert_sparse_close

from rbln_retrieval import PoolingEngine
from rbln_retrieval.remote import RemoteEngine
from rbln_retrieval.results.outputs import SpecialTokens, lexical_weights

# A repeated word exercises "the largest weight per token id".
TEXTS = ["the cat sat on the mat, the end", *mixed_length(24)]
TOLERANCE = 1e-5


@pytest.fixture(scope="module", params=["stock", "bundled"])
def bge_m3(request, tiny_models):
    path = tiny_models["bge-m3"]
    engine = PoolingEngine.shared(path, device="cpu", dtype="float32", runner=request.param)
    yield path, engine
    engine.close()


@pytest.fixture(scope="module")
def expected(tiny_models):
    return reference.bge_m3(str(tiny_models["bge-m3"]), TEXTS, max_length=512)


def _assert_sparse_close(ours: list[dict[int, float]], theirs: list[dict[int, float]]) -> None:
    assert_sparse_close(ours, theirs, TOLERANCE)


def test_family_is_detected_from_the_heads_beside_the_weights(bge_m3):
    _, engine = bge_m3
    assert engine.family.name == "bge-m3"
    assert engine.family.pool.pooling == "CLS"


def test_each_output_matches_flagembedding_recipe(bge_m3, expected):
    _, engine = bge_m3
    dense, sparse, multi = expected
    assert np.abs(engine.embed(TEXTS) - dense).max() <= TOLERANCE
    assert np.abs(engine.embed(TEXTS, output="dense") - dense).max() <= TOLERANCE
    ours_sparse = engine.embed(TEXTS, output="sparse")
    _assert_sparse_close(ours_sparse, sparse)
    assert sum(len(d) for d in sparse) > 3 * len(TEXTS), "the test model must give many non-zero weights"
    ours_multi = engine.embed(TEXTS, output="multi_vector")
    assert [m.shape for m in ours_multi] == [m.shape for m in multi]
    assert all(m.dtype == np.float32 for m in ours_multi)
    assert max(np.abs(a - b).max() for a, b in zip(ours_multi, multi)) <= TOLERANCE
    np.testing.assert_allclose(np.linalg.norm(ours_multi[0], axis=1), 1.0, atol=1e-6)


def test_several_outputs_in_one_call_equal_the_single_ones(bge_m3, expected):
    _, engine = bge_m3
    dense, sparse, multi = expected
    both = engine.embed(TEXTS, output=["sparse", "dense"])
    assert list(both) == ["sparse", "dense"]
    assert np.abs(both["dense"] - dense).max() <= TOLERANCE
    _assert_sparse_close(both["sparse"], sparse)
    every = engine.embed(TEXTS[:5], output=("dense", "sparse", "multi_vector"))
    assert max(np.abs(a - b).max() for a, b in zip(every["multi_vector"], multi[:5])) <= TOLERANCE
    assert np.abs(every["dense"] - dense[:5]).max() <= TOLERANCE


def test_empty_input_and_scores(bge_m3, expected):
    _, engine = bge_m3
    assert engine.embed([], output="sparse") == []
    assert engine.embed([], output=["dense", "multi_vector"])["dense"].shape == (0, engine.dimension)
    dense, _, _ = expected
    # bge-m3 scores documents by dense cosine, as the other bi-encoders.
    assert engine.score(TEXTS[0], TEXTS[1:4]) == pytest.approx(list(dense[1:4] @ dense[0]), abs=TOLERANCE)


def test_late_interaction_scores_are_colbert_scores(bge_m3, expected):
    path, engine = bge_m3
    _, _, multi = expected
    query = reference.bge_m3(str(path), [TEXTS[0]], max_length=512)[2][0]
    want = [reference.colbert_score(query, d) for d in multi[1:8]]
    assert engine.score(TEXTS[0], TEXTS[1:8], output="multi_vector") == pytest.approx(want, abs=TOLERANCE)
    ranked = engine.rerank(TEXTS[0], TEXTS[1:8], top_n=3, output="multi_vector")
    assert [i for i, _ in ranked] == sorted(range(7), key=lambda i: -want[i])[:3]
    assert engine.score(TEXTS[0], [], output="multi_vector") == []
    with pytest.raises(ValueError, match="score takes output='dense' or 'multi_vector', not 'sparse'"):
        engine.score(TEXTS[0], TEXTS[1:3], output="sparse")


def test_lexical_weights_follow_bge_m3_rules():
    special = SpecialTokens(bos=0, eos=2, unused=frozenset({0, 1, 2, 3}))
    # vLLM sends one weight per token between bos and eos.
    weights = np.array([0.5, 0.0, 0.7, -0.1, 0.2], dtype=np.float32)
    assert lexical_weights([0, 7, 8, 7, 9, 3, 2], weights, special) == {7: pytest.approx(0.7)}
    with pytest.raises(RuntimeError, match="3 token weights for a prompt of 4 tokens"):
        lexical_weights([0, 5, 6, 2], weights[:3], special)


def test_a_directory_with_only_one_head_is_a_plain_bi_encoder(tiny_models, tmp_path):
    import shutil

    from rbln_retrieval import ModelNotSupportedError, detect_family

    partial = tmp_path / "partial"
    shutil.copytree(tiny_models["bge-m3"], partial)
    (partial / "colbert_linear.pt").unlink()
    assert detect_family(partial).name == "bi-encoder"
    assert "architectures" not in detect_family(partial).graph.hf_overrides
    with pytest.raises(ModelNotSupportedError, match=r"is not a bge-m3 checkpoint: it lacks colbert_linear\.pt"):
        detect_family(partial, family="bge-m3")
    assert detect_family(tiny_models["bge-m3"]).graph.hf_overrides["architectures"] == ["BgeM3EmbeddingModel"]


def test_a_server_without_the_outputs_route_refuses_token_outputs(tiny_models, minilm):
    """vLLM's own server gives one pooling task per model and describes no outputs route: the client refuses sparse
    and multi-vector outputs in one sentence before sending anything (the fake server would fail any request);
    tests/server/test_multi_model_serve.py gets them from `rbln-retrieval serve`."""
    with FakeServer("500") as server:
        with RemoteEngine(str(tiny_models["bge-m3"]), base_url=server.url) as remote:
            for output in ("sparse", ["dense", "multi_vector"]):
                with pytest.raises(ValueError, match=r"is not served by this server .* with a local PoolingEngine"):
                    remote.embed(["a"], output=output)
            with pytest.raises(ValueError, match=r"output='multi_vector' .* is not served by this server"):
                remote.score("q", ["a"], output="multi_vector")
        with RemoteEngine(str(tiny_models["colbert"]), base_url=server.url) as remote:
            with pytest.raises(ValueError, match=r"is a ColBERT model with no pooled vector"):
                remote.embed(["a"])
            with pytest.raises(ValueError, match=r"output='multi_vector' .* is not served by this server"):
                remote.score("q", ["a"])
        with RemoteEngine(str(minilm), base_url=server.url) as remote:
            with pytest.raises(ValueError, match=r"has no sparse .* so it cannot give output='sparse'"):
                remote.embed(["a"], output="sparse")
            with pytest.raises(ValueError, match=r"has no multi-vector \(late-interaction\) head"):
                remote.score("q", ["a"], output="multi_vector")
    assert server.posts == []
