"""Cohere's routes, as ``cohere.ClientV2``, ``cohere.Client`` (v1) and langchain-cohere call them: /v2/embed,
/v1/embed and /v2/rerank, with ``meta.billed_units``.

/v2/embed embeds ``texts``, ``images`` (data URLs, through media.py) or ``inputs`` (content lists of one text or
one image each). ``input_type`` picks the model's prompt: search_query the query prompt, search_document,
classification and clustering the document prompt (a model without prompts embeds the text as given: Cohere's
clients always send one), image the images. ``embedding_types`` map onto the package's quantization
(rbln_retrieval.results.quantize): float, base64 (little-endian float32), int8/uint8 (each dimension's [-1, 1]
range of a normalized vector in 256 buckets, the same for every request, so vectors of separate requests compare),
binary/ubinary (packed sign bits). ``output_dimension`` cuts a matryoshka model's vectors; ``truncate`` NONE refuses
an over-long text, START keeps its end, END (default) its start. /v2/rerank ranks ``documents`` against ``query``;
``max_tokens_per_doc`` may be null or at least the model's max length (documents are cut there). /v1/embed is
/v2/embed's ``texts`` or ``images`` with v1's answer: without ``embedding_types`` the float vectors as a list
(``response_type`` embeddings_floats), with them v2's vectors by type.

Imports: engines (requests), results (quantize), server (check, engine_calls, responses, routes,
served); numpy; pydantic.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rbln_retrieval.engines.requests import Kind
from rbln_retrieval.results.quantize import quantize_embeddings
from rbln_retrieval.server import responses as answers
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.engine_calls import base64_float32, embed_texts, float_rows, scores, token_counts
from rbln_retrieval.server.routes import Context, Route
from rbln_retrieval.server.served import Served
from rbln_retrieval.text.inputs import Truncate

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
TRUNCATE: dict[str, Truncate] = {"NONE": "error", "START": "start", "END": "end"}
META = {"api_version": {"version": "2"}}


class ImageURL(BaseModel):
    url: str


class Content(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | str | None = None


class Input(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: list[Content]


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[Input] | None = None
    input_type: InputType | None = None
    embedding_types: list[EmbeddingType] | None = None
    output_dimension: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    truncate: Literal["NONE", "START", "END"] | None = None


class EmbedV1Request(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    input_type: InputType | None = None
    embedding_types: list[EmbeddingType] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    query: str
    documents: list[str]
    top_n: int | None = Field(default=None, ge=1)
    max_tokens_per_doc: int | None = Field(default=None, gt=0)
    return_documents: bool | None = None


def _split(request: EmbedRequest) -> tuple[list[str], list[tuple[str, Any]]]:
    """(texts, (name, image URL) items) of the request's one filled field."""
    given = [name for name in ("texts", "images", "inputs") if getattr(request, name) is not None]
    if len(given) != 1:
        raise Refused("Send one of `texts`, `images` or `inputs`.")
    if request.texts is not None:
        return request.texts, []
    if request.images is not None:
        return [], [(f"images[{i}]", url) for i, url in enumerate(request.images)]
    texts, images = [], []
    for i, item in enumerate(request.inputs or []):
        if len(item.content) != 1:
            raise Refused(f"inputs[{i}] holds {len(item.content)} parts; this server embeds one text or one image.")
        part = item.content[0]
        if part.type == "text":
            texts.append(part.text or "")
        else:
            url = part.image_url
            images.append((f"inputs[{i}]", url.url if isinstance(url, ImageURL) else url))
    if texts and images:
        raise Refused("`inputs` mixes texts and images; send them in separate requests.")
    return texts, images


async def embed(context: Context, request: EmbedRequest) -> dict[str, Any]:
    served = context.models.pick(request.model, "embed")
    if request.max_tokens is not None and request.max_tokens < served.family.tokens.max_length:
        raise Refused(
            f"`max_tokens` must be null or at least {served.name}'s max length ({served.family.tokens.max_length})."
        )
    texts, items = _split(request)
    truncate = TRUNCATE[request.truncate or "END"]
    if items:
        if request.output_dimension is not None:
            raise Refused("`output_dimension` applies to texts only.")
        images = await asyncio.to_thread(context.media.images, items, family=served.family, model=served.name)
        vectors = await served.engine.aembed_images(images)  # type: ignore[attr-defined]
        billed = {"images": len(images)}
    else:
        kind: Kind = "query" if request.input_type == "search_query" else "document"
        vectors = await embed_texts(served, texts, kind=kind, truncate=truncate, dimensions=request.output_dimension)
        billed = {"input_tokens": sum(await token_counts(served, texts))}
    answer: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "embeddings": {kind: by_type(vectors, kind) for kind in request.embedding_types or ["float"]},
        "texts": texts,
        "meta": {**META, "billed_units": billed},
        "response_type": "embeddings_by_type",
    }
    if items:
        answer["images"] = [{"width": im.width, "height": im.height, "format": "png", "bit_depth": 8} for im in images]
    return answer


async def embed_v1(context: Context, request: EmbedV1Request) -> dict[str, Any]:
    """v1's request through v2's adapter; v1's answer shapes (by ``embedding_types``, as v1 answers)."""
    answer = await embed(context, EmbedRequest.model_validate(request.model_dump()))
    answer["meta"]["api_version"] = {"version": "1"}
    if request.embedding_types is None:
        answer["embeddings"] = answer["embeddings"]["float"]
        answer["response_type"] = "embeddings_floats"
    return answer


def by_type(vectors: np.ndarray, kind: str) -> list[Any]:
    """The vectors as Cohere's embedding type ``kind``."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if kind == "float":
        return float_rows(vectors)
    if kind == "base64":
        return [base64_float32(row) for row in vectors]
    ranges = np.stack([np.full(vectors.shape[1], -1.0), np.full(vectors.shape[1], 1.0)]).astype(np.float32)
    quantized = quantize_embeddings(vectors, kind, ranges=ranges if kind in ("int8", "uint8") else None)
    rows: list[Any] = quantized.astype(np.int64).tolist()
    return rows


async def rerank(context: Context, request: RerankRequest) -> dict[str, Any]:
    served = context.models.pick(request.model, "score")
    _check_max_tokens(served, request.max_tokens_per_doc)
    values = await scores(served, request.query, request.documents)
    ranked = sorted(range(len(values)), key=lambda i: -values[i])[: request.top_n]
    results = [
        {"index": i, "relevance_score": values[i]}
        | ({"document": {"text": request.documents[i]}} if request.return_documents else {})
        for i in ranked
    ]
    return {"id": uuid.uuid4().hex, "results": results, "meta": {**META, "billed_units": {"search_units": 1}}}


def _check_max_tokens(served: Served, value: int | None) -> None:
    longest = served.family.tokens.max_length
    if value is not None and value < longest:
        raise Refused(
            f"`max_tokens_per_doc` must be null or at least {served.name}'s max length ({longest}); "
            "documents are cut there."
        )


ROUTES = (
    Route(
        "/v2/embed",
        "POST",
        "cohere",
        EmbedRequest,
        embed,
        "aembed (query/document prompt), aembed_images",
        answers.CohereEmbeddings,
    ),
    Route(
        "/v1/embed", "POST", "cohere", EmbedV1Request, embed_v1, "as /v2/embed, v1's answer", answers.CohereV1Embeddings
    ),
    Route("/v2/rerank", "POST", "cohere", RerankRequest, rerank, "ascore, ranked", answers.CohereRanking),
)
