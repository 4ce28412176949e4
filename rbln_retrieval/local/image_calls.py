"""PoolingEngine's image API: images of image-text models (CLIP, SigLIP) as vectors in the space of its text vectors,
and text queries scored against images.

Each image is checked and decoded first (rbln_retrieval.text.images), then sent as vLLM's multimodal prompt: no text
and one image, which vLLM's CLIP and SigLIP processors resize and normalise with the model's own image processor.

Imports: engines (loop, requests), models (families, multimodal), results (ranking), text (images, inputs); vLLM
inside the calls that build its requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np

from rbln_retrieval.engines.loop import EngineLoop
from rbln_retrieval.engines.requests import EmbedRequest
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.multimodal import texts_only
from rbln_retrieval.results.ranking import rank
from rbln_retrieval.text.images import image_chunks, load_images
from rbln_retrieval.text.inputs import check_query

# Decoding this few images costs less than a hop to a worker thread.
INLINE_DECODE = 4


def check_images_supported(family: ModelFamily, model: str) -> None:
    if not family.embeds_images:
        raise ValueError(texts_only(model, family.name))


def image_prompt(image: Any) -> dict[str, Any]:
    """vLLM's prompt for one image of an image-text model (CLIP and SigLIP refuse text beside an image)."""
    return {"prompt_token_ids": [], "multi_modal_data": {"image": image}}


class ImageEmbedding:
    """The image half of PoolingEngine (mixed into it): ``embed_images``, ``score_images``, ``rerank_images``."""

    family: ModelFamily
    model: str
    _loop: EngineLoop
    # PoolingEngine's own steps
    _encode: Callable[..., Awaitable[Any]]
    _embed: Callable[..., Awaitable[np.ndarray]]
    _progress: Callable[[Any, bool], Any]

    def embed_images(self, images: Iterable[Any], *, normalize: bool = True, show_progress: bool = False) -> Any:
        """Vectors for ``images`` (PIL images, ``pathlib.Path`` files, bytes or binary file objects; never a str)
        as a float32 array of shape (n, d) in the space of ``embed(texts)``, rows in input order. An image that
        cannot be decoded, is truncated, is over rbln_retrieval.text.images.MAX_PIXELS or has 16-bit or float pixels
        is refused in one sentence naming its index."""
        return self._loop.run(self._embed_images(images, normalize=normalize, show_progress=show_progress))

    async def aembed_images(
        self, images: Iterable[Any], *, normalize: bool = True, show_progress: bool = False
    ) -> np.ndarray:
        return await self._loop.arun(self._embed_images(images, normalize=normalize, show_progress=show_progress))

    def score_images(self, query: str, images: Iterable[Any]) -> list[float]:
        """Cosine of the text ``query`` with each image."""
        return self._loop.run(self._score_images(query, images))

    async def ascore_images(self, query: str, images: Iterable[Any]) -> list[float]:
        return await self._loop.arun(self._score_images(query, images))

    def rerank_images(self, query: str, images: Iterable[Any], *, top_n: int | None = None) -> list[tuple[int, float]]:
        """(index, cosine) pairs of the images, best first; ``top_n`` None keeps all."""
        return rank(self.score_images(query, images), top_n)

    async def _embed_images(self, images: Iterable[Any], *, normalize: bool, show_progress: bool) -> np.ndarray:
        check_images_supported(self.family, self.model)
        from vllm import PoolingParams

        params = PoolingParams(task="embed", use_activation=normalize)
        rows: list[np.ndarray] = []
        with self._progress(images, show_progress) as bar:
            for first, chunk in image_chunks(images):
                if len(chunk) <= INLINE_DECODE:
                    decoded = load_images(chunk, first_index=first)
                else:
                    decoded = await asyncio.to_thread(load_images, chunk, first_index=first)
                rows.extend(await self._encode([image_prompt(image) for image in decoded], params, bar=bar))
        if not rows:
            return np.zeros((0, self.family.hidden_size), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    async def _score_images(self, query: str, images: Iterable[Any]) -> list[float]:
        query = check_query(query)
        vectors = await self._embed_images(images, normalize=True, show_progress=False)
        if len(vectors) == 0:
            return []
        q = await self._embed([query], EmbedRequest(kind="query"), truncate="end")
        return [float(s) for s in vectors @ q[0]]
