"""Image-text models (CLIP, SigLIP) on the rbln target against the stand-in compiler: image and text vectors equal
transformers' own ``get_image_features`` / ``get_text_features``, and the graphs the stand-in received are what an
NPU takes (static shapes, ATen only, int32 indices, weights as state), the vision tower's among them with its FLOPs.
Both families on both routes: torch.compile (RBLN-CR13) and ahead of time (RBLN-CA25)."""

from __future__ import annotations

import numpy as np
import pytest
from multimodal_builders import IMAGE_SIZE, build_clip, build_siglip, reference_images, reference_texts, sample_images
from npu import checked_graphs, start_rbln

MIN_COSINE = 0.99999  # float32 on both sides
SHAPES = [[1, 64], [4, 128]]  # CLIP's 77-token texts need a 128-wide row
TEXTS = ["a photo of a cat", "the quick brown fox jumps over the lazy dog", "red", "Paris is the capital of France"]
IMAGE_BUCKETS = ["images 1", "images 8"]
CASES = [("clip", "RBLN-CR13"), ("siglip", "RBLN-CR13"), ("clip", "RBLN-CA25"), ("siglip", "RBLN-CA25")]
BUILDERS = {"clip": build_clip, "siglip": build_siglip}


@pytest.fixture(scope="module", params=CASES, ids=[f"{name}-{npu}" for name, npu in CASES])
def served(request, standin_rebel, tmp_path_factory):
    """(model dir, rbln-target engine, what the stand-in compiled for it) per family and route."""
    name, npu = request.param
    path = BUILDERS[name](tmp_path_factory.mktemp(name) / name)
    first = len(standin_rebel.COMPILED)
    engine = start_rbln(path, npu, settings={"shapes": SHAPES})
    try:
        yield path, engine, standin_rebel.COMPILED[first:]
    finally:
        engine.close()


def _min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    assert got.dtype == np.float32 and got.shape == want.shape
    return float(np.min(np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)))


def test_images_and_texts_equal_transformers_on_the_npu_routes(served):
    path, engine, _ = served
    images = sample_images(10)  # more than the largest image bucket: it runs twice
    image_cosine = _min_cosine(engine.embed_images(images), reference_images(path, images))
    text_cosine = _min_cosine(engine.embed(TEXTS), reference_texts(path, TEXTS))
    print(f"{engine.family.name} on {engine.stats()['npu']}: images {image_cosine:.7f}, texts {text_cosine:.7f}")
    assert image_cosine >= MIN_COSINE and text_cosine >= MIN_COSINE
    vision = engine.stats()["vision"]
    calls = vision["calls_per_bucket"]  # vLLM splits the images over steps as its scheduler sees fit
    assert vision["images"] == len(images) and set(calls) <= set(IMAGE_BUCKETS) and sum(calls.values()) >= 2


async def test_texts_and_images_in_one_step_equal_their_own_calls(served):
    import asyncio

    _, engine, _ = served
    images = sample_images(3, seed=5)
    together = await asyncio.gather(engine.aembed(TEXTS), engine.aembed_images(images))
    np.testing.assert_allclose(together[0], engine.embed(TEXTS), atol=1e-6)
    np.testing.assert_allclose(together[1], engine.embed_images(images), atol=1e-6)


def test_the_graphs_are_static_aten_int32_with_the_vision_tower_counted(served):
    """Correct vectors prove nothing about a graph: read the graphs the stand-in lowered."""
    _, engine, compiled = served
    stats = engine.stats()
    values = 3 * IMAGE_SIZE * IMAGE_SIZE  # 3072: already a multiple of 64
    for label, graph in checked_graphs(engine, compiled, ["1x64", "4x128", *IMAGE_BUCKETS], engine.family.name):
        if label.startswith("images"):
            count = int(label.split()[1])
            assert graph.input_shapes == [(count, values)] and graph.input_dtypes == ["torch.float32"]
            assert stats["vision"]["input_shapes"][label] == [count, values]
            # What the runner counts is what the stand-in counted on the lowered graph.
            assert stats["graph_costs"][label]["flops"] == pytest.approx(graph.flops, rel=1e-6)
        else:
            assert "torch.bool" in graph.input_dtypes, "the image slots enter as a mask input"
            assert ("torch.int32" in graph.input_dtypes) and "aten.where.self" in graph.ops
    assert stats["graph_costs"]["images 8"]["flops"] == pytest.approx(8 * stats["graph_costs"]["images 1"]["flops"])
