"""RBLNEmbeddings.embed_image with a real Chroma store: add_images and similarity_search_by_image on a tiny CLIP
model built offline, the stored vectors equal to the engine's and text->image ranking equal to its scores."""

from __future__ import annotations

from pathlib import Path

import chromadb
import numpy as np
import pytest
from langchain_chroma import Chroma
from multimodal_builders import build_clip, write_images

from langchain_rbln import RBLNEmbeddings


@pytest.fixture(scope="module")
def clip_embeddings(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    embeddings = RBLNEmbeddings(model=str(build_clip(root / "model")), device="cpu", dtype="float32")
    yield embeddings
    embeddings.close()


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> list[str]:
    return write_images(tmp_path_factory.mktemp("images"), 6, seed=7)


def test_chroma_add_images_and_search_by_image_and_text(clip_embeddings, image_files):
    store = Chroma(
        collection_name="images",
        embedding_function=clip_embeddings,
        client=chromadb.EphemeralClient(),
        collection_metadata={"hnsw:space": "cosine"},
    )
    ids = store.add_images(uris=image_files, metadatas=[{"file": f} for f in image_files])
    stored = store.get(ids=ids, include=["embeddings"])
    by_id = dict(zip(stored["ids"], stored["embeddings"]))
    engine = clip_embeddings.engine
    np.testing.assert_allclose(
        np.asarray([by_id[i] for i in ids]),
        engine.embed_images([Path(f) for f in image_files]),
        atol=1e-6,
    )
    for file in image_files[:3]:
        (best,) = store.similarity_search_by_image(uri=file, k=1)
        assert best.metadata["file"] == file
    query = "a photo of a cat"
    hits = store.similarity_search(query, k=3)
    order = [i for i, _ in engine.rerank_images(query, [Path(f) for f in image_files], top_n=3)]
    assert [hit.metadata["file"] for hit in hits] == [image_files[i] for i in order]


def test_embed_image_refuses_a_bad_file_in_one_sentence(clip_embeddings, tmp_path):
    bad = tmp_path / "notes.png"
    bad.write_text("not an image")
    with pytest.raises(ValueError, match=r"images\[0\] \(.*notes.png\) is not an image file PIL can decode\."):
        clip_embeddings.embed_image([str(bad)])
    with pytest.raises(ValueError, match=r"uris\[0\] is a https:// URL"):
        clip_embeddings.embed_image(["https://example.com/cat.png"])


def test_a_text_model_refuses_embed_image(minilm_embeddings, image_files):
    with pytest.raises(ValueError, match="embeds texts only"):
        minilm_embeddings.embed_image(image_files[:1])
