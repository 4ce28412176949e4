"""The bodies the server answers, as its OpenAPI schema declares them: each route's 200 body and each dialect's
error body, with the statuses a route can refuse with.

The handlers build plain dicts and lists (routes.py answers them as JSON); these models only describe them, so the
schema lane (tests/server/test_http_fuzz.py) checks every answer against its route's declared body and status. Every
object forbids keys it does not name, so an answer with a key the schema does not declare fails that check too.

Imports: server (check); pydantic.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rbln_retrieval.server.check import COMMON_STATUS, STATUS, Dialect


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- errors --------------------------------------------------------------------------------------------------------
class OpenAIErrorDetail(Body):
    message: str
    type: str
    param: str | None
    code: int


class OpenAIError(Body):
    """The refusal of the OpenAI, Jina/vLLM and this package's routes."""

    error: OpenAIErrorDetail


class TEIError(Body):
    error: str
    error_type: str


class CohereError(Body):
    message: str


ERROR_BODIES: dict[Dialect, type[Body]] = {"openai": OpenAIError, "tei": TEIError, "cohere": CohereError}
# Refusals of the middlewares (auth.py, limits.py) before a handler runs: no API key; a POST body that did not
# arrive in time, is too large or meets a full server.
GUARD_STATUSES = (401,)
POST_STATUSES = (408, 413, 429)


def error_responses(dialect: Dialect, method: str, names_model: bool) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of a route's refusals: the key, the check's and the engine's refusals in
    ``dialect``, the bounds of a POST, 404 for an unknown ``model`` where the request names one, and 500 (a request
    id, no traceback)."""
    statuses = {*GUARD_STATUSES, *STATUS[dialect].values(), COMMON_STATUS["backend"]}
    if method == "POST":
        statuses.update(POST_STATUSES)
    if names_model:
        statuses.add(COMMON_STATUS["not_found"])
    body = ERROR_BODIES[dialect]
    return {status: {"model": body, "description": "Refused in one sentence."} for status in sorted(statuses)}


# -- OpenAI and vLLM -----------------------------------------------------------------------------------------------
class Usage(Body):
    prompt_tokens: int
    total_tokens: int


class Embedding(Body):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class Embeddings(Body):
    object: Literal["list"]
    model: str
    data: list[Embedding]
    usage: Usage


class ModelCard(Body):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int | None


class ModelList(Body):
    object: Literal["list"]
    data: list[ModelCard]


class Score(Body):
    object: Literal["score"]
    index: int
    score: float


class Scores(Body):
    object: Literal["list"]
    model: str
    data: list[Score]
    usage: Usage


# -- TEI -----------------------------------------------------------------------------------------------------------
class SparseValue(Body):
    index: int
    value: float


class Label(Body):
    label: str
    score: float


class Token(Body):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class Info(Body):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, Any]
    max_concurrent_requests: int | None
    max_input_length: int | None
    max_batch_tokens: int | None
    max_client_batch_size: int | None
    tokenization_workers: int
    version: str


class Rank(Body):
    """One of TEI's /rerank results."""

    index: int
    score: float
    text: str | None = None


Dense = list[list[float]]
Sparse = list[list[SparseValue]]
TokenVectors = list[list[list[float]]]
Predictions = list[Label] | list[list[Label]]
Similarities = list[float]
Tokens = list[list[Token]]
Decoded = list[str]
Root = Dense | Predictions | Similarities


# -- Cohere, Jina --------------------------------------------------------------------------------------------------
class Document(Body):
    text: str


class RelevanceResult(Body):
    index: int
    relevance_score: float
    document: Document | None = None


class ApiVersion(Body):
    version: str


class BilledUnits(Body):
    input_tokens: int | None = None
    images: int | None = None
    search_units: int | None = None


class Meta(Body):
    api_version: ApiVersion
    billed_units: BilledUnits


Floats = list[list[float]]  # named outside the class below, whose field ``float`` would shadow the type


class EmbeddingsByType(Body):
    float: Floats | None = None
    base64: list[str] | None = None
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None


class ImageMeta(Body):
    width: int
    height: int
    format: str
    bit_depth: int


class CohereEmbeddings(Body):
    id: str
    embeddings: EmbeddingsByType
    texts: list[str]
    images: list[ImageMeta] | None = None
    meta: Meta
    response_type: Literal["embeddings_by_type"]


class CohereV1Embeddings(Body):
    id: str
    embeddings: EmbeddingsByType | list[list[float]]
    texts: list[str]
    images: list[ImageMeta] | None = None
    meta: Meta
    response_type: Literal["embeddings_by_type", "embeddings_floats"]


class CohereRanking(Body):
    id: str
    results: list[RelevanceResult]
    meta: Meta


class RerankUsage(Body):
    total_tokens: int


class JinaRanking(Body):
    id: str
    model: str
    results: list[RelevanceResult]
    usage: RerankUsage


# -- this package's own --------------------------------------------------------------------------------------------
class Description(BaseModel):
    """GET DESCRIBE_PATH: the served model's description (serve.describe), open to fields a later server adds."""

    model_config = ConfigDict(extra="allow")
    model: str
    family: dict[str, Any]
    limits: dict[str, int | None]


class Descriptions(Body):
    models: list[Description]


class QuantizedRow(Body):
    index: int
    embedding: str


class Quantized(Body):
    precision: str
    dtype: str
    data: list[QuantizedRow]


class SparseRow(Body):
    indices: list[int]
    values: list[float]


class Matrix(Body):
    shape: list[int]
    data: str


class OutputsRow(Body):
    index: int
    dense: str | None = None
    sparse: SparseRow | None = None
    multi_vector: Matrix | None = None


class Outputs(Body):
    model: str
    data: list[OutputsRow]


class Version(Body):
    version: str
