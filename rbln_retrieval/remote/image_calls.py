"""RemoteEngine's image API (embed_images, score_images, rerank_images): PoolingEngine's, against the image-text model
an `rbln-retrieval serve` server runs.

Each image is checked here with the local engine's loader (rbln_retrieval.text.images), so a bad image is refused
before anything is sent, in the sentence a local engine says; it then travels as a base64 data URL in vLLM's
chat-style /v1/embeddings request, one conversation per image (an image-text model takes one image and no text). The
bytes sent decode to the pixels the local engine embeds (text.images.encoded_image), so the vectors equal local
ones, float32, in the space of the server's text vectors. Requests are cut and spread over the replicas as the text
calls are.

Imports: engines (requests), models (families, multimodal), remote (calls), results (finite, ranking), text (images,
inputs); numpy.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import numpy as np

from rbln_retrieval.engines.requests import EmbedRequest
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.specs.image_text import texts_only
from rbln_retrieval.remote.calls import ClientLoop
from rbln_retrieval.results.finite import check_finite
from rbln_retrieval.results.ranking import rank
from rbln_retrieval.text.images import encoded_image, image_chunks
from rbln_retrieval.text.inputs import check_query

T = TypeVar("T")


def image_messages(items: list[Any], first: int) -> list[list[dict[str, Any]]]:
    """Each image (``images[first + i]``) as vLLM's chat conversation: a user message whose one content part is the
    image's data URL."""
    conversations = []
    for i, item in enumerate(items):
        media_type, data = encoded_image(item, first + i)
        url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
        conversations.append([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}])
    return conversations


class RemoteImageEmbedding(ClientLoop):
    """The image half of RemoteEngine (its base): ``embed_images``, ``score_images``, ``rerank_images``."""

    model: str
    # RemoteEngine's own steps
    _described: Callable[[], Awaitable[ModelFamily]]
    _embed: Callable[..., Awaitable[np.ndarray]]
    _batched: Callable[..., Awaitable[list[Any]]]
    _embedding_rows: Callable[[dict[str, Any], int, int], Awaitable[list[np.ndarray]]]

    def _call(self, timeout: float | None, work: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        raise NotImplementedError

    def embed_images(self, images: Iterable[Any], *, normalize: bool = True, show_progress: bool = False) -> Any:
        """Vectors for ``images`` (PIL images, ``pathlib.Path`` files, bytes or binary file objects; never a str) as a
        float32 array of shape (n, d) in the space of ``embed(texts)``, equal to a local engine's; ``show_progress``
        is accepted as PoolingEngine's and shows nothing. A bad image is refused before any request, naming it."""
        return self._run(self._call(None, self._embed_images(images, normalize=normalize)))

    async def aembed_images(
        self, images: Iterable[Any], *, normalize: bool = True, show_progress: bool = False
    ) -> np.ndarray:
        return await self._arun(self._call(None, self._embed_images(images, normalize=normalize)))

    def score_images(self, query: str, images: Iterable[Any]) -> list[float]:
        """Cosine of the text ``query`` with each image."""
        return self._run(self._call(None, self._score_images(query, images)))

    async def ascore_images(self, query: str, images: Iterable[Any]) -> list[float]:
        return await self._arun(self._call(None, self._score_images(query, images)))

    def rerank_images(self, query: str, images: Iterable[Any], *, top_n: int | None = None) -> list[tuple[int, float]]:
        """(index, cosine) pairs of the images, best first; ``top_n`` None keeps all."""
        return rank(self.score_images(query, images), top_n)

    async def arerank_images(
        self, query: str, images: Iterable[Any], *, top_n: int | None = None
    ) -> list[tuple[int, float]]:
        return rank(await self.ascore_images(query, images), top_n)

    async def _embed_images(self, images: Iterable[Any], *, normalize: bool) -> np.ndarray:
        family = await self._described()
        if not family.embeds_images:
            raise ValueError(texts_only(self.model, family.name))
        messages: list[Any] = []
        for first, chunk in image_chunks(images):  # every image checked and encoded before the first request
            messages += await asyncio.to_thread(image_messages, chunk, first)
        if not messages:
            return np.zeros((0, family.pool.hidden_size), dtype=np.float32)

        async def batch(conversations: list[Any]) -> list[np.ndarray]:
            body = {"messages": conversations, "use_activation": normalize}
            return await self._embedding_rows(body, len(conversations), family.pool.hidden_size)

        vectors = np.stack(await self._batched(messages, batch, what="images")).astype(np.float32, copy=False)
        check_finite(vectors, "images")
        return vectors

    async def _score_images(self, query: str, images: Iterable[Any]) -> list[float]:
        query = check_query(query)
        vectors = await self._embed_images(images, normalize=True)
        if len(vectors) == 0:
            return []
        q = await self._embed([query], EmbedRequest(kind="query"), truncate="end")
        return [float(s) for s in vectors @ q[0]]
