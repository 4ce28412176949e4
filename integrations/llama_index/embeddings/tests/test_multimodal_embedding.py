"""RBLNMultiModalEmbedding in LlamaIndex's MultiModalVectorStoreIndex: text->image and image->image retrieval on a
tiny CLIP model built offline, ranked as the engine scores them."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from llama_index.core.indices import MultiModalVectorStoreIndex
from llama_index.core.schema import ImageNode, TextNode
from multimodal_builders import build_clip, write_images

from llama_index.embeddings.rbln import RBLNMultiModalEmbedding


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    root = tmp_path_factory.mktemp("clip")
    embedding = RBLNMultiModalEmbedding(model_name=build_clip(root / "model"), device="cpu", dtype="float32")
    yield embedding
    embedding.close()


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> list[str]:
    return write_images(tmp_path_factory.mktemp("images"), 6, seed=11)


def test_multimodal_index_retrieves_images_by_text_and_by_image(clip, image_files):
    nodes = [ImageNode(image_path=f, metadata={"file": f}) for f in image_files]
    nodes.append(TextNode(text="An NPU is a neural processing unit."))
    index = MultiModalVectorStoreIndex(nodes, embed_model=clip, image_embed_model=clip)
    retriever = index.as_retriever(similarity_top_k=1, image_similarity_top_k=3)

    query = "a photo of a cat"
    hits = retriever.text_to_image_retrieve(query)
    order = [i for i, _ in clip._engine.rerank_images(query, [Path(f) for f in image_files], top_n=3)]
    assert [hit.node.metadata["file"] for hit in hits] == [image_files[i] for i in order]
    for hit, (_, score) in zip(hits, clip._engine.rerank_images(query, [Path(f) for f in image_files], top_n=3)):
        assert hit.score == pytest.approx(score, abs=1e-5)

    best = retriever.image_to_image_retrieve(image_files[2])[0]
    assert best.node.metadata["file"] == image_files[2]
    assert best.score == pytest.approx(1.0, abs=1e-5)


def test_image_paths_and_file_objects_embed_alike(clip, image_files):
    from_path = clip.get_image_embedding(image_files[0])
    from_bytes = clip.get_image_embedding(io.BytesIO(Path(image_files[0]).read_bytes()))
    np.testing.assert_allclose(from_path, from_bytes, atol=1e-6)
    batch = clip.get_image_embedding_batch(image_files[:2])
    np.testing.assert_allclose(batch[0], from_path, atol=1e-6)


def test_a_text_model_is_refused(minilm):
    with pytest.raises(ValueError, match="embeds texts only; RBLNMultiModalEmbedding needs an image-text model"):
        RBLNMultiModalEmbedding(model_name=minilm, device="cpu", dtype="float32")
