"""The contract every engine of this package keeps, local (PoolingEngine) or remote (RemoteEngine), and the claim
on a shared one (EngineHandle): framework integrations program against it alone.

Imports: models, results and text, for typing only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from rbln_retrieval.models.families import ModelFamily
    from rbln_retrieval.results.quantize import Precision
    from rbln_retrieval.text.inputs import Truncate


# The read-only route on which `rbln-retrieval serve` describes its model (family, prompts and templates,
# dimensions, max length) and RemoteEngine reads it: the one contract between the server and the client. Under /v1,
# so the server's API key guards it like the rest of the API.
DESCRIBE_PATH = "/v1/rbln-retrieval/model"
# vLLM's /v1/embeddings request plus ``precision`` and ``ranges``, answered with each row's quantized bytes (base64)
# and their dtype: the quantized form is what travels (rbln_retrieval.server.quantized). Named in the description.
QUANTIZED_EMBED_PATH = "/v1/rbln-retrieval/embeddings"


@runtime_checkable
class RetrievalEngine(Protocol):
    """Embeddings, relevance scores and rankings for one model, sync and async.

    ``embed`` returns a float32 array (n, d) with rows in input order (other ``precision``: quantized as
    rbln_retrieval.results.quantize says, int8/uint8 with ``ranges`` or ``calibration_embeddings``); ``score`` one
    float per document in input order; ``rerank`` (index, score) pairs best first (rbln_retrieval.results.ranking).
    ``truncate`` ("end", "start", "error"; None: the object's default) applies per call; a remote engine also takes a
    per-call ``timeout``."""

    model: str

    @property
    def family(self) -> ModelFamily: ...

    @property
    def dimension(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    def embed(
        self,
        texts: Iterable[str],
        *,
        kind: Literal["document", "query"] = ...,
        instruction: str | None = ...,
        dimensions: int | None = ...,
        normalize: bool = ...,
        show_progress: bool = ...,
        truncate: Truncate | None = ...,
        precision: Precision = ...,
        ranges: np.ndarray | None = ...,
        calibration_embeddings: np.ndarray | None = ...,
    ) -> np.ndarray: ...

    async def aembed(
        self,
        texts: Iterable[str],
        *,
        kind: Literal["document", "query"] = ...,
        instruction: str | None = ...,
        dimensions: int | None = ...,
        normalize: bool = ...,
        show_progress: bool = ...,
        truncate: Truncate | None = ...,
        precision: Precision = ...,
        ranges: np.ndarray | None = ...,
        calibration_embeddings: np.ndarray | None = ...,
    ) -> np.ndarray: ...

    def score(
        self, query: str, documents: Iterable[str], *, instruction: str | None = ..., truncate: Truncate | None = ...
    ) -> list[float]: ...

    async def ascore(
        self, query: str, documents: Iterable[str], *, instruction: str | None = ..., truncate: Truncate | None = ...
    ) -> list[float]: ...

    def rerank(
        self,
        query: str,
        documents: Iterable[str],
        *,
        top_n: int | None = ...,
        instruction: str | None = ...,
        truncate: Truncate | None = ...,
    ) -> list[tuple[int, float]]: ...

    async def arerank(
        self,
        query: str,
        documents: Iterable[str],
        *,
        top_n: int | None = ...,
        instruction: str | None = ...,
        truncate: Truncate | None = ...,
    ) -> list[tuple[int, float]]: ...

    def close(self) -> None: ...
