"""ColPali on the rbln target against the stand-in compiler: page and query token vectors equal transformers' own
ColPaliForRetrieval, MaxSim scores the MaxSim of its vectors (within 1e-4), and the graphs the stand-in received
are what an NPU takes (static shapes, ATen only, int32 indices, weights as state): the SigLIP tower and PaliGemma's
projector per image-count bucket, the Gemma's bidirectional steps over the merged image-and-prompt embeddings.
One engine per route (RBLN-CR13, RBLN-CA25)."""

from __future__ import annotations

import numpy as np
import pytest
from multimodal_builders import (
    COLPALI_DIM,
    COLPALI_IMAGE_TOKENS,
    IMAGE_SIZE,
    build_colpali,
    reference_colpali,
    sample_images,
)
from npu import checked_graphs, start_rbln

MIN_COSINE = 0.99999  # float32 on both sides
MAXSIM_RTOL = 1e-4
SHAPES = [[1, 128], [4, 128]]  # the longest query (a token per character, and its template) is over 64
QUERIES = ["a photo of a cat", "red", "the quick brown fox jumps over the lazy dog"]
IMAGE_BUCKETS = ["images 1", "images 8"]
NPUS = ["RBLN-CR13", "RBLN-CA25"]
PAGES = 10  # more than the largest image bucket: it runs twice


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_colpali(tmp_path_factory.mktemp("colpali") / "model")


@pytest.fixture(scope="module", params=NPUS)
def served(request, model_dir, standin_rebel):
    """(rbln-target engine, what the stand-in compiled for it) per route."""
    first = len(standin_rebel.COMPILED)
    engine = start_rbln(model_dir, request.param, settings={"shapes": SHAPES})
    try:
        yield engine, standin_rebel.COMPILED[first:]
    finally:
        engine.close()


@pytest.fixture(scope="module")
def pages():
    return sample_images(PAGES, seed=7)


@pytest.fixture(scope="module")
def reference(model_dir, pages):
    """transformers' page vectors, then its query vectors."""
    return reference_colpali(model_dir, images=pages, queries=QUERIES)


def _min_cosine(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    assert [g.shape for g in got] == [w.shape for w in want] and all(g.dtype == np.float32 for g in got)
    a, b = np.concatenate(got), np.concatenate(want)
    return float(np.min(np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))


def _maxsim(queries: list[np.ndarray], pages: list[np.ndarray]) -> np.ndarray:
    return np.array([[float((q @ p.T).max(axis=1).sum()) for p in pages] for q in queries])


def test_pages_and_queries_equal_transformers_on_the_npu_routes(served, model_dir, pages, reference):
    engine, _ = served
    page_vectors = engine.embed_images(pages, output="multi_vector")
    query_vectors = engine.embed(QUERIES, output="multi_vector")
    assert all(v.shape[1] == COLPALI_DIM for v in page_vectors + query_vectors)
    assert all(len(v) > COLPALI_IMAGE_TOKENS for v in page_vectors)
    page_cosine = _min_cosine(page_vectors, reference[:PAGES])
    query_cosine = _min_cosine(query_vectors, reference[PAGES:])
    want = _maxsim(reference[PAGES:], reference[:PAGES])
    got = np.array([engine.score_images(query, pages) for query in QUERIES])
    error = float(np.max(np.abs(got - want) / np.abs(want)))
    npu = engine.stats()["npu"]
    print(f"colpali on {npu}: pages {page_cosine:.7f}, queries {query_cosine:.7f}, MaxSim {error:.1e}")
    assert page_cosine >= MIN_COSINE and query_cosine >= MIN_COSINE
    np.testing.assert_allclose(got, want, rtol=MAXSIM_RTOL)
    vision = engine.stats()["vision"]
    calls = vision["calls_per_bucket"]
    # vLLM reuses a page it has seen (its multimodal cache): score_images embeds no page again.
    assert vision["images"] == PAGES and set(calls) <= set(IMAGE_BUCKETS) and sum(calls.values()) >= 2


def test_the_graphs_are_static_aten_int32_with_the_vision_tower_counted(served):
    """Correct vectors prove nothing about a graph: read the graphs the stand-in lowered."""
    engine, compiled = served
    stats = engine.stats()
    values = 3 * IMAGE_SIZE * IMAGE_SIZE  # 3072: already a multiple of 64
    hidden = 64  # the tiny Gemma's width
    for label, graph in checked_graphs(engine, compiled, ["1x128", "4x128", *IMAGE_BUCKETS], "colpali"):
        if label.startswith("images"):
            count = int(label.split()[1])
            assert graph.input_shapes == [(count, values)] and graph.input_dtypes == ["torch.float32"]
            assert stats["graph_costs"][label]["flops"] == pytest.approx(graph.flops, rel=1e-6)
        else:
            rows, width = map(int, label.split("x"))
            # The step takes the merged embeddings (image tokens' and prompt tokens'), never token ids.
            assert (rows * width, hidden) in graph.input_shapes and "torch.int32" in graph.input_dtypes
    assert stats["graph_costs"]["images 8"]["flops"] == pytest.approx(8 * stats["graph_costs"]["images 1"]["flops"])
