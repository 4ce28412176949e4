"""RBLNMultiModalEmbedding: LlamaIndex image and text embeddings in one space (CLIP, SigLIP) through rbln-retrieval."""

from __future__ import annotations

import os
from typing import Any

from llama_index.core.base.embeddings.base import Embedding
from llama_index.core.embeddings import MultiModalEmbedding
from llama_index.core.schema import ImageType

from llama_index.embeddings.rbln.base import RBLNEmbedding
from rbln_retrieval.text.images import framework_images


class RBLNMultiModalEmbedding(RBLNEmbedding, MultiModalEmbedding):
    """Texts and images of an image-text model (CLIP, SigLIP) as vectors in one space, for
    ``MultiModalVectorStoreIndex(image_embed_model=...)`` (text->image and image->image retrieval). Images are file
    paths or binary file objects, decoded and preprocessed by the model's own processor; everything else (engine
    sharing, remote mode, options) is RBLNEmbedding's.

    Examples:
        ```python
        from llama_index.core.indices import MultiModalVectorStoreIndex
        from llama_index.embeddings.rbln import RBLNMultiModalEmbedding

        clip = RBLNMultiModalEmbedding(model_name="openai/clip-vit-base-patch32")
        index = MultiModalVectorStoreIndex(nodes, embed_model=clip, image_embed_model=clip)
        ```
    """

    def __init__(self, model_name: str | os.PathLike[str] | None = None, **kwargs: Any):
        super().__init__(model_name, **kwargs)
        family = self._engine.family
        if not family.embeds_images:
            raise ValueError(
                f"{self.model_name} is a {family.name} model, which embeds texts only; RBLNMultiModalEmbedding needs "
                "an image-text model (CLIP, SigLIP)."
            )

    @classmethod
    def class_name(cls) -> str:
        return "RBLNMultiModalEmbedding"

    def _image_options(self) -> dict[str, Any]:
        if self.precision != "float32":
            raise ValueError(f"precision={self.precision!r} applies to texts; images embed as float32 only.")
        return {"normalize": self.normalize, "show_progress": self.show_progress}

    def _get_image_embedding(self, img_file_path: ImageType) -> Embedding:
        return self._get_image_embeddings([img_file_path])[0]

    async def _aget_image_embedding(self, img_file_path: ImageType) -> Embedding:
        return (await self._aget_image_embeddings([img_file_path]))[0]

    def _get_image_embeddings(self, img_file_paths: list[ImageType]) -> list[Embedding]:
        images = framework_images(img_file_paths, "img_file_paths")
        return self._engine.embed_images(images, **self._image_options()).tolist()

    async def _aget_image_embeddings(self, img_file_paths: list[ImageType]) -> list[Embedding]:
        images = framework_images(img_file_paths, "img_file_paths")
        return (await self._engine.aembed_images(images, **self._image_options())).tolist()
