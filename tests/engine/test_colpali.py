"""ColPali on the bundled host runner against transformers' own ColPaliForRetrieval: page images and text queries as
token vectors (multi-vectors), MaxSim scores as ColPaliProcessor.score_retrieval gives them, and what a ColPali
engine refuses. One engine for the module (tests/engine_budget.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from multimodal_builders import COLPALI_DIM, COLPALI_IMAGE_TOKENS, build_colpali, reference_colpali, sample_images

from rbln_retrieval import ModelNotSupportedError, PoolingEngine, detect_family

MIN_COSINE = 0.99999  # float32 on both sides
MAXSIM_RTOL = 1e-4
QUERIES = ["a photo of a cat", "red", "the quick brown fox jumps over the lazy dog"]
PAGES = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_colpali(tmp_path_factory.mktemp("colpali") / "model")


@pytest.fixture(scope="module")
def engine(model_dir):
    handle = PoolingEngine.shared(model_dir, device="cpu", dtype="float32")
    yield handle
    handle.close()


@pytest.fixture(scope="module")
def pages():
    return sample_images(PAGES, seed=7)


@pytest.fixture(scope="module")
def reference(model_dir, pages) -> list[np.ndarray]:
    """transformers' page vectors, then its query vectors."""
    return reference_colpali(model_dir, images=pages, queries=QUERIES)


def _min_cosine(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """The smallest cosine of any token vector with transformers' vector of the same token."""
    assert [g.shape for g in got] == [w.shape for w in want]
    rows_got, rows_want = np.concatenate(got), np.concatenate(want)
    cosines = (
        np.sum(rows_got * rows_want, axis=1) / np.linalg.norm(rows_got, axis=1) / np.linalg.norm(rows_want, axis=1)
    )
    return float(cosines.min())


def _score_retrieval(model_dir: Path, queries: list[np.ndarray], pages: list[np.ndarray]) -> np.ndarray:
    import torch
    from transformers import ColPaliProcessor

    processor = ColPaliProcessor.from_pretrained(str(model_dir))
    as_tensors = [[torch.from_numpy(x) for x in xs] for xs in (queries, pages)]
    return processor.score_retrieval(*as_tensors).numpy()


def test_pages_and_queries_equal_transformers(engine, model_dir, pages, reference):
    page_vectors = engine.embed_images(pages, output="multi_vector")
    query_vectors = engine.embed(QUERIES, output="multi_vector")
    assert all(v.dtype == np.float32 and v.shape[1] == COLPALI_DIM for v in page_vectors + query_vectors)
    # Every prompt token's vector, in input order: the page's patches, <bos>, its prompt and "\n".
    assert all(len(v) > COLPALI_IMAGE_TOKENS for v in page_vectors)
    assert _min_cosine(page_vectors, reference[:PAGES]) >= MIN_COSINE
    assert _min_cosine(query_vectors, reference[PAGES:]) >= MIN_COSINE
    want = _score_retrieval(model_dir, reference[PAGES:], reference[:PAGES])
    got = np.array([engine.score_images(query, pages) for query in QUERIES])
    np.testing.assert_allclose(got, want, rtol=MAXSIM_RTOL)
    best = engine.rerank_images(QUERIES[0], pages, top_n=2)
    assert [i for i, _ in best] == list(np.argsort(-want[0])[:2])
    assert engine.embed_images([], output="multi_vector") == []


@pytest.mark.parametrize("broken", ["bias dropped", "causal attention"])
def test_the_reference_tells_vllms_colpali_apart(broken, model_dir, pages, reference):
    """The tiny model is one where vLLM 0.30's own ColPali (a projection without bias, causal attention) gives other
    vectors, so the parity test above fails if either fix is undone."""
    import torch
    from transformers import ColPaliConfig, ColPaliForRetrieval, ColPaliProcessor

    processor = ColPaliProcessor.from_pretrained(str(model_dir))
    config = ColPaliConfig.from_pretrained(str(model_dir))
    batch = processor.process_images(images=[pages[0]])
    if broken == "causal attention":  # Gemma's own causal mask, and no prefix for PaliGemma to open up
        config.vlm_config.text_config.use_bidirectional_attention = False
        batch.pop("token_type_ids")
    model = ColPaliForRetrieval.from_pretrained(str(model_dir), config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        if broken == "bias dropped":
            model.embedding_proj_layer.bias.zero_()
        vectors = model(**batch).embeddings[0].numpy()
    assert _min_cosine([vectors], reference[:1]) < MIN_COSINE


def test_colpali_refuses_what_it_does_not_give(engine, pages):
    with pytest.raises(ValueError, match=r"is a ColPali model with no pooled vector .*output='multi_vector'"):
        engine.embed(QUERIES)
    with pytest.raises(ValueError, match=r"is a ColPali model with no sparse .*output='multi_vector'"):
        engine.embed(QUERIES, output="sparse")
    with pytest.raises(ValueError, match=r"is a ColPali model with no pooled vector .*output='multi_vector'"):
        engine.embed_images(pages)
    with pytest.raises(ValueError, match=r"images\[1\] is not an image file PIL can decode\."):
        engine.embed_images([pages[0], b"not an image"], output="multi_vector")


def test_colpali_preset(model_dir):
    family = detect_family(model_dir)
    assert (family.name, family.pool.hidden_size, family.graph.image_size) == ("colpali", COLPALI_DIM, 32)
    assert (family.prompt.query_prompt, family.prompt.text_suffix, family.prompt.image_prompt) == (
        "<bos>Question: ",
        "<pad>" * 10 + "\n",
        "Describe the image.\n",
    )
    assert family.embeds_images and family.late_interaction_only


def test_colqwen_is_refused_in_one_sentence(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["ColQwen2ForRetrieval"]}))
    with pytest.raises(ModelNotSupportedError, match=r"does not run: .*needs torchvision, which this platform"):
        detect_family(tmp_path)


async def test_the_server_gives_colpali_pages_over_http_as_the_engine_does(engine, pages):
    """The server's own outputs route sends a page image through the one media check and answers each page's token
    vectors, equal to the engine's (vLLM's server could not start on a model with token vectors only)."""
    import base64

    import httpx
    from multimodal_builders import png_bytes

    from rbln_retrieval.engines.protocol import OUTPUTS_PATH
    from rbln_retrieval.server.app import build_app
    from rbln_retrieval.server.limits import Limits
    from rbln_retrieval.server.served import Served, ServedModels

    app = build_app(ServedModels([Served("colpali", engine, {})]), limits=Limits())
    urls = ["data:image/png;base64," + base64.b64encode(png_bytes(page)).decode() for page in pages]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=300) as client:
        answer = await client.post(OUTPUTS_PATH, json={"images": urls, "output": "multi_vector"})
    assert answer.status_code == 200, answer.text
    got = [
        np.frombuffer(base64.b64decode(row["multi_vector"]["data"]), dtype="<f4").reshape(row["multi_vector"]["shape"])
        for row in answer.json()["data"]
    ]
    want = engine.embed_images(pages, output="multi_vector")
    assert len(got) == len(want)
    for page, expected in zip(got, want):
        np.testing.assert_array_equal(page, expected)
