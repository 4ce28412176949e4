"""Hugging Face text-embeddings-inference's routes, as TEI's clients (huggingface_hub's InferenceClient, llama-index's
TextEmbeddingsInference, LangChain's and Haystack's TEI classes) call them.

/embed gives dense vectors, /embed_sparse sparse ones (sparse models) as ``{"index", "value"}`` lists, /embed_all
every token's vector (multi-vector models); /rerank scores ``texts`` against ``query`` best first (``raw_scores``: the
logit of a cross-encoder's probability; ``return_text``), /predict a cross-encoder's score of each [query, text]
pair, or of one text alone (its classifier head on that one sequence, as TEI runs it); /similarity the cosine of
each of ``sentences`` with ``source_sentence`` (an embedder's vectors, as TEI answers); /tokenize and /decode use
the model's tokenizer; GET /info describes the model; POST / answers as /embed for an embedder and as /predict for a
cross-encoder, as TEI dispatches by its model's type, and as /similarity for a similarity body. Request fields:
``normalize``, ``truncate`` (false: an over-long text is refused naming it), ``truncation_direction`` ("left" keeps
a text's end), ``prompt_name`` ("query" or "document": the model's prompt of that kind; none: the text as given) and
``dimensions``. A route the model's type cannot answer is refused 424, as TEI does.

Imports: engines (requests), server (check, engine_calls, responses, routes, served); numpy, pydantic.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rbln_retrieval.engines.requests import Kind
from rbln_retrieval.server import responses as answers
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.engine_calls import check_token_ids, embed_texts, float_rows, scores, truncation
from rbln_retrieval.server.routes import VERSION, Context, Route
from rbln_retrieval.server.served import Served

Direction = Literal["right", "left", "Right", "Left"]


class Inputs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class EmbedRequest(Inputs):
    normalize: bool = True
    dimensions: int | None = Field(default=None, gt=0)


class RerankRequest(BaseModel):
    """TEI's rerank request (POST /rerank with ``texts``: rerank_routes.py dispatches by the body)."""

    model_config = ConfigDict(extra="ignore")
    query: str
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: Direction = "right"


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str] | list[list[str]]
    raw_scores: bool = False
    truncate: bool | None = None
    truncation_direction: Direction = "right"


class SimilarityInputs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    source_sentence: str
    sentences: list[str]


class SimilarityRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: SimilarityInputs
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class DecodeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


def _kind(prompt_name: str | None) -> Kind | None:
    if prompt_name is None:
        return None
    if prompt_name not in ("query", "document"):
        raise Refused(f"`prompt_name` is {prompt_name!r}; this server's prompts are 'query' and 'document'.")
    return "query" if prompt_name == "query" else "document"


def _texts(inputs: str | list[str]) -> list[str]:
    return [inputs] if isinstance(inputs, str) else list(inputs)


async def _embed(
    context: Context, request: Inputs, output: str, normalize: bool = True, dims: int | None = None
) -> Any:
    served = context.models.pick(None, "embed")
    truncate = truncation(bool(request.truncate), left=request.truncation_direction.lower() == "left")
    return await embed_texts(
        served,
        _texts(request.inputs),
        kind=_kind(request.prompt_name),
        normalize=normalize,
        truncate=truncate,
        dimensions=dims,
        output=output,
    )


async def embed(context: Context, request: EmbedRequest) -> list[list[float]]:
    return float_rows(await _embed(context, request, "dense", request.normalize, request.dimensions))


async def embed_sparse(context: Context, request: Inputs) -> list[list[dict[str, Any]]]:
    rows = await _embed(context, request, "sparse")
    return [[{"index": int(i), "value": float(v)} for i, v in sorted(row.items())] for row in rows]


async def embed_all(context: Context, request: Inputs) -> list[list[list[float]]]:
    return [float_rows(matrix) for matrix in await _embed(context, request, "multi_vector")]


async def rerank(context: Context, request: RerankRequest) -> list[dict[str, Any]]:
    served = context.models.pick(None, "score")
    truncate = truncation(bool(request.truncate), left=request.truncation_direction.lower() == "left")
    values = await scores(served, request.query, request.texts, truncate)
    ranked = sorted(range(len(values)), key=lambda i: -values[i])
    raw = request.raw_scores and served.family.is_cross_encoder
    return [
        {"index": i, "score": _logit(values[i]) if raw else values[i]}
        | ({"text": request.texts[i]} if request.return_text else {})
        for i in ranked
    ]


def _logit(p: float) -> float:
    """A cross-encoder's raw score: the logit its probability is the sigmoid of."""
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


async def predict(context: Context, request: PredictRequest) -> list[Any]:
    served = context.models.pick(None, "score")
    if not served.family.is_cross_encoder:
        raise Refused(f"{served.name} is an embedder, not a classifier; use /embed.", "wrong_model")
    inputs = request.inputs
    truncate = truncation(bool(request.truncate), left=request.truncation_direction.lower() == "left")
    if isinstance(inputs, str):  # one sequence through the classifier head, as TEI runs it
        classify = getattr(served.engine, "aclassify", None)
        if classify is None:
            raise Refused(f"{served.name} classifies [query, text] pairs here; send `inputs` as a pair.")
        (value,) = await classify([inputs], truncate=truncate)
        return [_label(value, request.raw_scores)]
    single = bool(inputs) and all(isinstance(x, str) for x in inputs)
    pairs: list[Any] = [inputs] if single else list(inputs)
    if any(isinstance(pair, str) or len(pair) != 2 for pair in pairs):
        raise Refused(f"{served.name} scores [query, text] pairs; send `inputs` as [query, text] or a list of them.")
    values = await asyncio.gather(*(scores(served, query, [text], truncate) for query, text in pairs))
    answers = [[_label(v[0], request.raw_scores)] for v in values]
    return answers[0] if single else answers


def _label(probability: float, raw: bool) -> dict[str, Any]:
    return {"label": "LABEL_0", "score": _logit(probability) if raw else probability}


async def similarity(context: Context, request: SimilarityRequest) -> list[float]:
    """Cosine of each sentence with the source sentence: the model's normalized vectors, all embedded alike."""
    served = context.models.pick(None, "embed")
    truncate = truncation(bool(request.truncate), left=request.truncation_direction.lower() == "left")
    texts = [request.inputs.source_sentence, *request.inputs.sentences]
    kind = _kind(request.prompt_name)
    vectors = np.asarray(await embed_texts(served, texts, kind=kind, normalize=True, truncate=truncate))
    return [float(value) for value in vectors[1:] @ vectors[0]]


def _tokenizer(served: Served) -> Any:
    tokenizer = getattr(served.engine, "tokenizer", None)
    if tokenizer is None:
        raise Refused(f"{served.name}'s tokenizer is not available on this server.", "wrong_model")
    return tokenizer.hf


async def tokenize(context: Context, request: TokenizeRequest) -> list[list[dict[str, Any]]]:
    served = context.models.pick(None, "any")
    hf = _tokenizer(served)
    kind = _kind(request.prompt_name)
    prefix = (
        ""
        if kind is None
        else (served.family.prompt.query_prompt if kind == "query" else served.family.prompt.document_prompt)
    )
    texts = [prefix + text for text in _texts(request.inputs)]
    if not texts:
        raise Refused("`inputs` is an empty list; send a text or a list of texts to tokenize.", "empty")

    def encode() -> Any:
        return hf(texts, add_special_tokens=request.add_special_tokens, return_offsets_mapping=True)

    encoded = await asyncio.to_thread(encode)
    special = set(hf.all_special_ids)
    return [
        [
            {"id": i, "text": text[a:b], "special": i in special, "start": a if b else None, "stop": b if b else None}
            for i, (a, b) in zip(ids, offsets)
        ]
        for text, ids, offsets in zip(texts, encoded["input_ids"], encoded["offset_mapping"])
    ]


async def decode(context: Context, request: DecodeRequest) -> list[str]:
    served = context.models.pick(None, "any")
    hf = _tokenizer(served)
    ids = request.ids
    flat = not ids or isinstance(ids[0], int)
    batch: list[list[int]] = [ids] if flat else ids  # type: ignore[list-item,assignment]
    check_token_ids(served, batch, "ids", flat=flat)
    texts: list[str] = hf.batch_decode(batch, skip_special_tokens=request.skip_special_tokens)
    return texts


async def info(context: Context, _: None) -> dict[str, Any]:
    served = context.models.pick(None, "any")
    family = served.family
    if family.is_cross_encoder:
        model_type: dict[str, Any] = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    else:
        model_type = {"embedding": {"pooling": (family.pool.pooling or "mean").lower()}}
    limits = served.description.get("limits", {})
    return {
        "model_id": served.name,
        "model_sha": served.description.get("weights"),
        "model_dtype": str(getattr(served.engine, "dtype", "float32")),
        "model_type": model_type,
        "max_concurrent_requests": limits.get("max_concurrent_requests"),
        "max_input_length": family.tokens.max_length,
        "max_batch_tokens": limits.get("max_queued_tokens"),
        "max_client_batch_size": limits.get("max_inputs_per_request"),
        "tokenization_workers": 1,
        "version": VERSION,
    }


class RootRequest(BaseModel):
    """POST /: /embed's request for an embedder, /predict's for a cross-encoder, /similarity's by its body."""

    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str] | list[list[str]] | SimilarityInputs
    normalize: bool = True
    dimensions: int | None = Field(default=None, gt=0)
    raw_scores: bool = False
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = None


async def root(context: Context, request: RootRequest) -> list[Any]:
    served = context.models.pick(None, "any")
    fields = request.model_dump()
    if isinstance(request.inputs, SimilarityInputs):
        return await similarity(context, SimilarityRequest.model_validate(fields))
    if served.family.is_cross_encoder:
        return await predict(context, PredictRequest.model_validate(fields))
    if not all(isinstance(x, str) for x in _texts(request.inputs)):  # type: ignore[arg-type]
        raise Refused(f"{served.name} is an embedder; send `inputs` as a text or a list of texts.")
    return await embed(context, EmbedRequest.model_validate(fields))


ROUTES = (
    Route("/embed", "POST", "tei", EmbedRequest, embed, "aembed", answers.Dense),
    Route("/embed_sparse", "POST", "tei", Inputs, embed_sparse, 'aembed(output="sparse")', answers.Sparse),
    Route("/embed_all", "POST", "tei", Inputs, embed_all, 'aembed(output="multi_vector")', answers.TokenVectors),
    Route("/predict", "POST", "tei", PredictRequest, predict, "ascore of each pair", answers.Predictions),
    Route(
        "/similarity",
        "POST",
        "tei",
        SimilarityRequest,
        similarity,
        "aembed, cosine with the source sentence",
        answers.Similarities,
    ),
    Route("/tokenize", "POST", "tei", TokenizeRequest, tokenize, "the model's tokenizer", answers.Tokens),
    Route("/decode", "POST", "tei", DecodeRequest, decode, "the model's tokenizer", answers.Decoded),
    Route("/info", "GET", "tei", None, info, "the model's description", answers.Info),
    Route("/", "POST", "tei", RootRequest, root, "/embed, /predict or /similarity", answers.Root),
)
