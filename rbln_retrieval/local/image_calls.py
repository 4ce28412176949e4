"""PoolingEngine's image API: images of image-text models as vectors in the space of its text vectors, page images of
late-interaction image models as token vectors, and text queries scored against images.

Each image is checked and decoded first (rbln_retrieval.text.images), then sent as vLLM's multimodal prompt: one
image and the family's image prompt (``image_prompt``: none, or a page prompt), which vLLM's processors
resize and normalise with the model's own image processor.

Imports: engines (loop, requests), models (families, specs.image_text), results (outputs, ranking), text (images,
inputs, tokens); vLLM inside the calls that build its requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import numpy as np

from rbln_retrieval.engines.loop import EngineLoop
from rbln_retrieval.engines.requests import EmbedRequest
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.specs.image_text import texts_only
from rbln_retrieval.results.outputs import Output, check_outputs, maxsim
from rbln_retrieval.results.ranking import rank
from rbln_retrieval.text.images import image_chunks, load_images
from rbln_retrieval.text.inputs import check_query
from rbln_retrieval.text.tokens import PromptTokenizer

# Decoding this few images costs less than a hop to a worker thread.
INLINE_DECODE = 4


def check_images_supported(family: ModelFamily, model: str) -> None:
    if not family.embeds_images:
        raise ValueError(texts_only(model, family.name))


def image_prompt(image: Any, text_ids: list[int] | None = None) -> dict[str, Any]:
    """vLLM's prompt for one image: no text for a family without an image prompt (its processor refuses text beside
    an image), else the image prompt's tokens (vLLM's processor puts the image tokens before them)."""
    return {"prompt_token_ids": list(text_ids or []), "multi_modal_data": {"image": image}}


class ImageEmbedding:
    """The image half of PoolingEngine (mixed into it): ``embed_images``, ``score_images``, ``rerank_images``."""

    family: ModelFamily
    model: str
    tokenizer: PromptTokenizer
    _loop: EngineLoop
    # PoolingEngine's own steps
    _encode: Callable[..., Awaitable[Any]]
    _embed: Callable[..., Awaitable[np.ndarray]]
    _embed_any: Callable[..., Awaitable[Any]]
    _progress: Callable[[Any, bool], Any]

    def embed_images(
        self, images: Iterable[Any], *, output: Output = "dense", normalize: bool = True, show_progress: bool = False
    ) -> Any:
        """Vectors for ``images`` (PIL images, ``pathlib.Path`` files, bytes or binary file objects; never a str)
        as a float32 array of shape (n, d) in the space of ``embed(texts)``, rows in input order. Pages of a
        late-interaction image model take ``output="multi_vector"`` (its only output): a list of float32
        (tokens, d) arrays, one per page, every prompt token's vector (the image's patches, then the page prompt's).
        An image that cannot be decoded, is truncated, is over rbln_retrieval.text.images.MAX_PIXELS or has 16-bit
        or float pixels is refused in one sentence naming its index."""
        run = self._embed_images(images, output=output, normalize=normalize, show_progress=show_progress)
        return self._loop.run(run)

    async def aembed_images(
        self, images: Iterable[Any], *, output: Output = "dense", normalize: bool = True, show_progress: bool = False
    ) -> Any:
        run = self._embed_images(images, output=output, normalize=normalize, show_progress=show_progress)
        return await self._loop.arun(run)

    def score_images(self, query: str, images: Iterable[Any]) -> list[float]:
        """Relevance of each image to the text ``query``: the cosine of their vectors, or for a late-interaction
        family MaxSim of the query's token vectors over the page's (reduced as its spec's ``maxsim_reduction``)."""
        return self._loop.run(self._score_images(query, images))

    async def ascore_images(self, query: str, images: Iterable[Any]) -> list[float]:
        return await self._loop.arun(self._score_images(query, images))

    def rerank_images(self, query: str, images: Iterable[Any], *, top_n: int | None = None) -> list[tuple[int, float]]:
        """(index, score) pairs of the images, best first; ``top_n`` None keeps all."""
        return rank(self.score_images(query, images), top_n)

    async def _embed_images(
        self, images: Iterable[Any], *, output: Output, normalize: bool, show_progress: bool
    ) -> Any:
        check_images_supported(self.family, self.model)
        check_outputs(output, family=self.family.name, model=self.model)
        from vllm import PoolingParams

        multi = output == "multi_vector"
        params = PoolingParams(task="token_embed" if multi else "embed", use_activation=normalize)
        text = self.family.prompt.image_prompt
        text_ids = None if text is None else self.tokenizer.hf(text, add_special_tokens=False)["input_ids"]
        rows: list[np.ndarray] = []
        with self._progress(images, show_progress) as bar:
            for first, chunk in image_chunks(images):
                if len(chunk) <= INLINE_DECODE:
                    decoded = load_images(chunk, first_index=first)
                else:
                    decoded = await asyncio.to_thread(load_images, chunk, first_index=first)
                prompts = [image_prompt(image, text_ids) for image in decoded]
                rows.extend(await self._encode(prompts, params, bar=bar, stack=not multi))
        if multi:
            return [row.reshape(-1, self.family.pool.hidden_size).astype(np.float32, copy=False) for row in rows]
        if not rows:
            return np.zeros((0, self.family.pool.hidden_size), dtype=np.float32)
        return np.stack(rows).astype(np.float32, copy=False)

    async def _score_images(self, query: str, images: Iterable[Any]) -> list[float]:
        query = check_query(query)
        if self.family.late_interaction_only:
            pages = await self._embed_images(images, output="multi_vector", normalize=True, show_progress=False)
            if not pages:
                return []
            request = EmbedRequest(kind="query", output="multi_vector")
            (q,) = await self._embed_any([query], request, truncate="end")
            return [maxsim(q, page, family=self.family.name) for page in pages]
        vectors = await self._embed_images(images, output="dense", normalize=True, show_progress=False)
        if len(vectors) == 0:
            return []
        q = await self._embed([query], EmbedRequest(kind="query"), truncate="end")
        return [float(s) for s in vectors @ q[0]]
