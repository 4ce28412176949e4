"""Image-text models (CLIP, SigLIP) on the bundled host runner against transformers' own models, the image inputs
an engine takes and the ones it refuses, and the multimodal checkpoints refused by name."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from multimodal_builders import (
    build_clip,
    build_siglip,
    png_bytes,
    reference_images,
    reference_texts,
    sample_images,
)
from PIL import Image

from rbln_retrieval import ModelNotSupportedError, PoolingEngine, detect_family
from rbln_retrieval.text import images as image_inputs

MIN_COSINE = 0.99999  # float32 on both sides
TEXTS = ["a photo of a cat", "the quick brown fox jumps over the lazy dog", "red", "Paris is the capital of France"]
BUILDERS = {"clip": build_clip, "siglip": build_siglip}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("image-text")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def engines(model_dirs):
    handles = {name: PoolingEngine.shared(path, device="cpu", dtype="float32") for name, path in model_dirs.items()}
    yield handles
    for handle in handles.values():
        handle.close()


def _min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    assert got.dtype == np.float32 and got.shape == want.shape
    return float(np.min(np.sum(got * want, axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_images_and_texts_equal_transformers_in_one_space(name, model_dirs, engines):
    engine, path = engines[name], model_dirs[name]
    images = sample_images(7)
    image_vectors = engine.embed_images(images)
    text_vectors = engine.embed(TEXTS)
    assert _min_cosine(image_vectors, reference_images(path, images)) >= MIN_COSINE
    assert _min_cosine(text_vectors, reference_texts(path, TEXTS)) >= MIN_COSINE
    assert image_vectors.shape[1] == text_vectors.shape[1] == engine.dimension
    # The space is shared: a text scores every image as the dot product of the two vectors.
    scores = engine.score_images(TEXTS[0], images)
    np.testing.assert_allclose(scores, image_vectors @ text_vectors[0], atol=1e-6)
    best = engine.rerank_images(TEXTS[0], images, top_n=2)
    assert [i for i, _ in best] == list(np.argsort(-np.asarray(scores))[:2])


def test_siglip_texts_are_padded_to_the_towers_length(model_dirs, engines):
    """SigLIP pools the last position of a text padded to its tower's length: unpadded, its vectors differ (the trap
    this guards against), and the engine gives the padded ones."""
    from transformers import AutoModel, AutoTokenizer

    path = model_dirs["siglip"]
    tokenizer, model = AutoTokenizer.from_pretrained(str(path)), AutoModel.from_pretrained(str(path)).eval()
    ids = tokenizer(TEXTS[0], return_tensors="pt")["input_ids"]
    unpadded = model.get_text_features(input_ids=ids).pooler_output[0].detach().numpy()
    unpadded /= np.linalg.norm(unpadded)
    padded = reference_texts(path, TEXTS[:1])[0]
    assert float(unpadded @ padded) < 0.999
    assert float(engines["siglip"].embed(TEXTS[:1])[0] @ padded) >= MIN_COSINE


def test_every_image_form_gives_the_same_vector(tmp_path, engines):
    engine = engines["clip"]
    image = sample_images(1)[0]
    file = tmp_path / "image.png"
    file.write_bytes(png_bytes(image))
    forms = [image, file, png_bytes(image), bytearray(png_bytes(image)), io.BytesIO(png_bytes(image))]
    vectors = engine.embed_images(forms)
    assert vectors.shape == (len(forms), engine.dimension)
    np.testing.assert_allclose(vectors, np.repeat(vectors[:1], len(forms), axis=0), atol=1e-6)
    assert engine.embed_images([]).shape == (0, engine.dimension)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK"])
def test_other_modes_are_converted_as_the_models_processor_does(mode, model_dirs, engines):
    image = sample_images(1, seed=3)[0].convert(mode)
    got = engines["clip"].embed_images([image])
    assert _min_cosine(got, reference_images(model_dirs["clip"], [image])) >= MIN_COSINE


def _truncated_png() -> bytes:
    data = png_bytes(sample_images(1)[0])
    return data[: len(data) // 2]


@pytest.mark.parametrize(
    ("item", "error", "message"),
    [
        ("cat.png", TypeError, r"images\[1\] is a str; pass pathlib.Path"),
        (b"not an image", ValueError, r"images\[1\] is not an image file PIL can decode\."),
        (_truncated_png(), ValueError, r"images\[1\] is truncated or corrupt"),
        (Image.new("I;16", (8, 8)), ValueError, r"images\[1\] has mode 'I;16'"),
        (Image.new("RGB", (0, 4)), ValueError, r"images\[1\] has no pixels"),
        (Path("/nonexistent/cat.png"), ValueError, r"images\[1\] \(/nonexistent/cat.png\) cannot be read"),
        (3.5, TypeError, r"images\[1\] is float; expected a PIL image"),
    ],
)
def test_a_bad_image_is_refused_in_one_sentence_naming_it(item, error, message, engines):
    with pytest.raises(error, match=message):
        engines["clip"].embed_images([sample_images(1)[0], item])


def test_an_image_over_the_pixel_limit_is_refused_before_decoding(monkeypatch, engines):
    monkeypatch.setattr(image_inputs, "MAX_PIXELS", 1000)
    with pytest.raises(ValueError, match=r"images\[0\] is 48x40 pixels, over the limit of 1,000 pixels\."):
        engines["clip"].embed_images(sample_images(1))


@pytest.mark.parametrize("images", ["cat.png", Path("cat.png"), b"bytes", sample_images(1)[0]])
def test_a_single_image_in_place_of_a_list_is_refused(images, engines):
    with pytest.raises(TypeError, match="images is a single"):
        engines["clip"].embed_images(images)


def test_a_text_model_refuses_images(minilm):
    from rbln_retrieval.local.image_calls import check_images_supported

    with pytest.raises(ValueError, match="embeds texts only; images need CLIP, SigLIP or ColPali"):
        check_images_supported(detect_family(minilm), str(minilm))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_image_text_presets(name, model_dirs):
    family = detect_family(model_dirs[name])
    assert (family.name, family.pool.hidden_size, family.graph.image_size, family.embeds_images) == (name, 32, 32, True)
    assert family.tokens.pad_text_to_max_length == (name == "siglip")
    assert family.tokens.max_length == (77 if name == "clip" else 16)
    with pytest.raises(ValueError, match="texts take its text tower's length"):
        detect_family(model_dirs[name], max_length=8)


@pytest.mark.parametrize(
    ("arch", "reason"),
    [
        ("ColQwen2ForRetrieval", "needs torchvision"),
        ("CLIPVisionModel", "use the full CLIPModel checkpoint"),
    ],
)
def test_multimodal_checkpoints_refused_by_name(arch, reason, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    with pytest.raises(
        ModelNotSupportedError, match=f"is a {arch} checkpoint, which rbln-retrieval does not run: .*{reason}"
    ):
        detect_family(tmp_path)


def test_a_traced_engine_embeds_as_the_untraced_one(model_dirs, engines):
    """strict_shapes traces the steps as the NPU target does (the vision tower as graphs of its own, the text tower
    without vLLM's host-synchronising merge; the NPU routes: tests/backend/test_image_text_rbln.py)."""
    images = sample_images(3, seed=7)
    buckets = {"additional_config": {"rbln_retrieval": {"buckets": [64, 256]}}}  # 16-token texts fill them
    options = {"device": "cpu", "dtype": "float32", "strict_shapes": True, "engine_kwargs": buckets}
    with PoolingEngine(model_dirs["siglip"], **options) as traced:
        np.testing.assert_allclose(traced.embed_images(images), engines["siglip"].embed_images(images), atol=1e-6)
        np.testing.assert_allclose(traced.embed(TEXTS), engines["siglip"].embed(TEXTS), atol=1e-6)
        stats = traced.stats()
    assert stats["traced"] and stats["compiles_after_warmup"] == 0 and stats["vision"]["images"] == len(images)
    assert {g["bucket"] for g in stats["graphs"]} >= {"images 1", "images 8"}


def test_cli_embeds_image_files_as_the_engine_does(tmp_path, model_dirs, engines):
    from cli_run import cli, one_error_line
    from multimodal_builders import write_images

    files = write_images(tmp_path, 3)
    out = tmp_path / "vectors.npy"
    options = ["--device", "cpu", "--dtype", "float32", "--no-progress"]
    result = cli("embed", "-m", str(model_dirs["clip"]), "--images", *files, "-o", str(out), *options)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(out), engines["clip"].embed_images([Path(f) for f in files]), atol=1e-6)
    refused = cli("embed", "-m", str(model_dirs["clip"]), "--images", *files, "--kind", "query", *options)
    assert one_error_line(refused) == "rbln-retrieval: error: --kind query applies to texts, not to --images."


@pytest.mark.parametrize("name", sorted(BUILDERS))
async def test_texts_and_images_in_one_step_equal_their_own_calls(name, engines):
    """Concurrent calls share vLLM's steps: a step holding both image and text prompts gives each its own vector."""
    import asyncio

    engine = engines[name]
    images = sample_images(5, seed=5)
    alone_texts, alone_images = engine.embed(TEXTS), engine.embed_images(images)
    texts_vectors, image_vectors = await asyncio.gather(engine.aembed(TEXTS), engine.aembed_images(images))
    np.testing.assert_allclose(texts_vectors, alone_texts, atol=1e-6)
    np.testing.assert_allclose(image_vectors, alone_images, atol=1e-6)
