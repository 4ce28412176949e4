"""The contract every engine of this package keeps, local (PoolingEngine) or remote (RemoteEngine), and the claim
on a shared one (EngineHandle): framework integrations program against it alone.

Imports: engines (requests) and models, for typing only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol, Unpack, runtime_checkable

if TYPE_CHECKING:
    from rbln_retrieval.engines.requests import EmbedOptions, RerankOptions, ScoreOptions
    from rbln_retrieval.models.families import ModelFamily


# The read-only route on which `rbln-retrieval serve` describes its model (family, prompts and templates,
# dimensions, max length) and RemoteEngine reads it: the one contract between the server and the client. Under /v1,
# so the server's API key guards it like the rest of the API.
DESCRIBE_PATH = "/v1/rbln-retrieval/model"
# vLLM's /v1/embeddings request plus ``precision`` and ``ranges``, answered with each row's quantized bytes (base64)
# and their dtype: the quantized form is what travels (rbln_retrieval.server.quantized). Named in the description.
QUANTIZED_EMBED_PATH = "/v1/rbln-retrieval/embeddings"
# Token-level and sparse outputs (multi-vector and sparse heads; page images' token vectors) and dense vectors,
# each row's outputs as their bytes (rbln_retrieval.server.own_routes). Named in the description.
OUTPUTS_PATH = "/v1/rbln-retrieval/outputs"


@runtime_checkable
class RetrievalEngine(Protocol):
    """Embeddings, relevance scores and rankings for one model, sync and async.

    ``embed`` returns a float32 array (n, d) with rows in input order (other ``precision``: quantized as
    rbln_retrieval.results.quantize says, int8/uint8 with ``ranges`` or ``calibration_embeddings``; other
    ``output``: sparse or multi-vectors, rbln_retrieval.results.outputs); ``score`` one float per document in input
    order; ``rerank`` (index, score) pairs best first (rbln_retrieval.results.ranking). Every call takes the options
    of rbln_retrieval.engines.requests as keywords: ``truncate`` ("end", "start", "error", "chunk"; None: the
    object's default) applies per call, ``timeout`` to a remote engine only."""

    model: str

    @property
    def family(self) -> ModelFamily: ...

    @property
    def dimension(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def embed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any: ...

    async def aembed(self, texts: Iterable[str], **options: Unpack[EmbedOptions]) -> Any: ...

    def score(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]: ...

    async def ascore(self, query: str, documents: Iterable[str], **options: Unpack[ScoreOptions]) -> list[float]: ...

    def rerank(
        self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]
    ) -> list[tuple[int, float]]: ...

    async def arerank(
        self, query: str, documents: Iterable[str], **options: Unpack[RerankOptions]
    ) -> list[tuple[int, float]]: ...

    def close(self) -> None: ...
