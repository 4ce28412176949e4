"""Non-finite values: a ranking never misorders around a NaN score, vectors and scores holding NaN or an infinity
are refused in one sentence naming the input, and quantization ranges must be finite. No engine: the remote path
is in tests/remote/test_remote_client.py, the local one shares check_finite."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rbln_retrieval import NonFiniteResultError, quantize_embeddings, rank
from rbln_retrieval.results.finite import check_finite

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "scores, top_n, expected",
    [
        ([1.0, NAN, 5.0, 3.0], 2, [2, 3]),
        ([NAN, 1.0, NAN, 2.0], None, [3, 1, 0, 2]),
        ([NAN, NAN], 1, [0]),
        ([0.5, -INF, INF, 0.5], None, [2, 0, 3, 1]),
    ],
)
def test_rank_puts_nan_last_and_keeps_every_number_in_order(scores, top_n, expected):
    ranked = rank(scores, top_n)
    assert [i for i, _ in ranked] == expected
    assert all(s == scores[i] or (math.isnan(s) and math.isnan(scores[i])) for i, s in ranked)


def test_vectors_and_scores_with_nan_or_infinity_are_refused_naming_the_first_input():
    check_finite(np.ones((3, 4), dtype=np.float32), "texts")  # finite: nothing to say
    check_finite([], "documents")
    rows = np.ones((4, 3), dtype=np.float32)
    rows[2, 1], rows[3, 0] = INF, NAN
    with pytest.raises(NonFiniteResultError) as failure:
        check_finite(rows, "texts", first_index=1024)
    message = str(failure.value)
    assert message.startswith("The result for text 1026 (and 1 more) holds an infinity: ") and "\n" not in message
    with pytest.raises(NonFiniteResultError, match=r"^The result for document 0 holds NaN"):
        check_finite([NAN, 0.3], "documents")


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_quantization_ranges_must_be_finite(bad):
    vectors = np.array([[0.1, -0.2], [0.3, 0.4]], dtype=np.float32)
    ranges = np.array([[-1.0, -1.0], [1.0, bad]])
    with pytest.raises(ValueError, match=r"^ranges must be finite numbers, but dimension 1 has \[-1\.0, "):
        quantize_embeddings(vectors, "int8", ranges=ranges)
    calibration = np.array([[0.0, 0.0], [1.0, bad]])
    with pytest.raises(ValueError, match=r"^calibration_embeddings' ranges must be finite numbers, but dimension 1"):
        quantize_embeddings(vectors, "uint8", calibration_embeddings=calibration)


def test_a_local_engine_refuses_the_vectors_and_scores_of_broken_weights(tiny_models, tmp_path):
    """A checkpoint whose weights hold NaN (a diverged fine-tune): every output is NaN, and the engine says so in
    one sentence instead of returning them."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from rbln_retrieval import PoolingEngine

    broken = {}
    for name in ("bert-cls", "bert-cross-encoder"):
        model = Path(shutil.copytree(tiny_models[name], tmp_path / name))
        weights = load_file(model / "model.safetensors")
        first = next(key for key in sorted(weights) if "embeddings" in key and weights[key].is_floating_point())
        weights[first] = torch.full_like(weights[first], float("nan"))
        save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
        broken[name] = model
    with PoolingEngine(broken["bert-cls"], device="cpu", dtype="float32") as engine:
        with pytest.raises(NonFiniteResultError, match=r"^The result for text 0 \(and 1 more\) holds NaN: "):
            engine.embed(["a", "b"])
    with PoolingEngine(broken["bert-cross-encoder"], device="cpu", dtype="float32") as engine:
        with pytest.raises(NonFiniteResultError, match=r"^The result for document 0 \(and 1 more\) holds NaN: "):
            engine.rerank("q", ["a", "b"])
