"""OpenAI's embeddings routes (/v1/embeddings, /v1/models) and vLLM's /score, in the wire format RemoteEngine and
the ``openai`` client use.

/v1/embeddings embeds ``input`` texts as given (a client puts any prompt in them), or the images of chat-style
``messages`` (one image per conversation, image-text models; each through media.py), as float lists or base64 of
little-endian float32, cut to ``dimensions``; ``use_activation`` (or ``normalize``) false gives raw vectors;
``truncate_prompt_tokens`` (the model's max length, or -1) truncates over-long texts (``truncation_side`` "left"
keeps their end), else an over-long text is refused naming it. Token ids (one list of ints, or a list of them) are
embedded as the model's ids, as vLLM does, under the same truncation; an id outside the vocabulary is refused
naming it. /score and /v1/score give one score per document for ``queries`` (one query) and ``documents``, with
the ``instruction`` of the models that take one (a template reranker: RemoteEngine sends its query and documents, the
engine puts them in the model's template).

Imports: models, server (check, engine_calls, responses, routes, served).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rbln_retrieval.server import responses as answers
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.engine_calls import (
    base64_float32,
    embed_ids,
    embed_texts,
    float_rows,
    scores,
    token_counts,
)
from rbln_retrieval.server.routes import Context, Route
from rbln_retrieval.server.served import Served
from rbln_retrieval.text.inputs import Truncate


class ImageURL(BaseModel):
    url: str


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    image_url: ImageURL | str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart]


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request, with vLLM's fields RemoteEngine sends."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    messages: list[Message] | list[list[Message]] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    embed_dtype: Literal["float32"] = "float32"
    endianness: Literal["little", "native"] = "little"
    use_activation: bool | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    user: str | None = None


class ScoreRequest(BaseModel):
    """vLLM's score request: one query (``queries``, ``text_1``) against ``documents`` (``text_2``)."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    queries: str | None = None
    documents: list[str] | str | None = None
    text_1: str | None = None
    text_2: list[str] | str | None = None
    instruction: str | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None


def vllm_truncation(served: Served, tokens: int | None, side: str | None) -> Truncate:
    """vLLM's ``truncate_prompt_tokens`` as the engine's truncate: the model's max length (or -1) only."""
    if tokens is None:
        return "error"
    if tokens not in (-1, served.family.tokens.max_length):
        raise Refused(
            f"`truncate_prompt_tokens` is {tokens}; this server truncates to the model's max length only "
            f"({served.family.tokens.max_length}, or -1)."
        )
    return "start" if side == "left" else "end"


async def embeddings(context: Context, request: EmbeddingsRequest) -> dict[str, Any]:
    served = context.models.pick(request.model, "embed")
    normalize = next((v for v in (request.use_activation, request.normalize) if v is not None), True)
    if (request.input is None) == (request.messages is None):
        raise Refused("Send either `input` (texts) or `messages` (images in chat form), not both or neither.")
    if request.messages is not None:
        images = await asyncio.to_thread(_message_images, context, served, request.messages)
        vectors = await served.engine.aembed_images(images, normalize=normalize)  # type: ignore[attr-defined]
        counts = [0] * len(images)
    else:
        given: list[Any] = [request.input] if isinstance(request.input, str) else list(request.input or [])
        truncate = vllm_truncation(served, request.truncate_prompt_tokens, request.truncation_side)
        if given and not isinstance(given[0], str):  # token ids: one prompt, or a list of them
            ids: list[list[int]] = [given] if isinstance(given[0], int) else given
            vectors = await embed_ids(
                served, ids, normalize=normalize, truncate=truncate, dimensions=request.dimensions
            )
            counts = [len(row) for row in ids]
        else:
            texts: list[str] = given
            vectors = await embed_texts(
                served, texts, kind=None, normalize=normalize, truncate=truncate, dimensions=request.dimensions
            )
            counts = await token_counts(served, texts)
    rows: list[Any] = (
        [base64_float32(row) for row in vectors] if request.encoding_format == "base64" else float_rows(vectors)
    )
    return {
        "object": "list",
        "model": served.name,
        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
        "usage": {"prompt_tokens": sum(counts), "total_tokens": sum(counts)},
    }


def _message_images(context: Context, served: Served, messages: Any) -> list[Any]:
    """The one image of each conversation (a list of messages), every one through the media check."""
    conversations = messages if messages and isinstance(messages[0], list) else [messages]
    items = []
    for c, conversation in enumerate(conversations):
        name = f"messages[{c}]"
        parts = [
            part for message in conversation for part in (message.content if isinstance(message.content, list) else ())
        ]
        other = [part.type for part in parts if part.type != "image_url"]
        texts = [message for message in conversation if isinstance(message.content, str)]
        if other or texts:
            kind = other[0] if other else "text"
            raise Refused(f"{name} holds a {kind} part; this route embeds one image per conversation.")
        if len(parts) != 1:
            raise Refused(f"{name} holds {len(parts)} images; send one image per conversation.")
        url = parts[0].image_url
        items.append((name, url.url if isinstance(url, ImageURL) else url))
    return context.media.images(items, family=served.family, model=served.name)


async def models(context: Context, _: None) -> dict[str, Any]:
    data = [
        {
            "id": name,
            "object": "model",
            "created": 0,
            "owned_by": "rbln-retrieval",
            "root": name,
            "max_model_len": served.family.tokens.max_length,
        }
        for name, served in context.models.items()
    ]
    return {"object": "list", "data": data}


async def score(context: Context, request: ScoreRequest) -> dict[str, Any]:
    served = context.models.pick(request.model, "score")
    query = request.queries if request.queries is not None else request.text_1
    documents = request.documents if request.documents is not None else request.text_2
    if query is None or documents is None:
        raise Refused("Send `queries` (one query) and `documents` (or `text_1` and `text_2`).")
    documents = [documents] if isinstance(documents, str) else documents
    truncate = vllm_truncation(served, request.truncate_prompt_tokens, request.truncation_side)
    values = await scores(served, query, documents, truncate, request.instruction)
    tokens = sum(await token_counts(served, [query + " " + d for d in documents]))
    return {
        "object": "list",
        "model": served.name,
        "data": [{"object": "score", "index": i, "score": s} for i, s in enumerate(values)],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


ROUTES = (
    Route(
        "/v1/embeddings",
        "POST",
        "openai",
        EmbeddingsRequest,
        embeddings,
        "aembed (texts as given), aembed_images",
        answers.Embeddings,
    ),
    Route("/v1/models", "GET", "openai", None, models, "the served models", answers.ModelList),
    Route("/score", "POST", "openai", ScoreRequest, score, "ascore", answers.Scores),
    Route("/v1/score", "POST", "openai", ScoreRequest, score, "ascore", answers.Scores),
)
