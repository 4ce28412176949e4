"""The engine API's call options, typed once: what ``embed``, ``score`` and ``rerank`` (sync and async) take on
PoolingEngine, RemoteEngine, EngineHandle and the RetrievalEngine protocol.

A call takes its options as keywords, ``**options: Unpack[EmbedOptions]``, which a type checker checks against the
TypedDicts below; the engine turns them into one frozen request (EmbedRequest, ScoreRequest, RerankRequest) holding
the defaults, which refuses an unknown keyword and is what the engine's own steps pass on.

Imports: results (outputs, quantize) and text (inputs), for typing only; numpy for typing only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    import numpy as np

    from rbln_retrieval.results.outputs import Output
    from rbln_retrieval.results.quantize import Precision
    from rbln_retrieval.text.inputs import Truncate

Kind = Literal["document", "query"]
ScoreOutput = Literal["dense", "multi_vector"]


class CallOptions(TypedDict, total=False):
    """The keywords every call takes: how an over-long input is cut (None: the engine's default) and, for a remote
    engine, the whole call's timeout."""

    truncate: Truncate | None
    timeout: float | None


class EmbedOptions(CallOptions, total=False):
    """``embed``/``aembed`` keywords; their defaults and meaning are EmbedRequest's."""

    kind: Kind
    instruction: str | None
    dimensions: int | None
    normalize: bool
    show_progress: bool
    output: Output | Sequence[Output]
    precision: Precision
    ranges: np.ndarray | None
    calibration_embeddings: np.ndarray | None


class ScoreOptions(CallOptions, total=False):
    """``score``/``ascore`` keywords; their defaults and meaning are ScoreRequest's."""

    instruction: str | None
    output: ScoreOutput


class RerankOptions(ScoreOptions, total=False):
    """``rerank``/``arerank`` keywords: ScoreOptions and ``top_n``."""

    top_n: int | None


@dataclass(frozen=True, kw_only=True, eq=False)
class EmbedRequest:
    """One ``embed`` call's options. ``kind`` picks the family's document or query prompt, which ``instruction``
    overrides; ``dimensions`` cuts a matryoshka model's vectors; ``truncate`` None is the engine's default;
    ``timeout`` bounds a remote call (a local engine refuses one); ``output``, ``precision``, ``ranges`` and
    ``calibration_embeddings`` as PoolingEngine.embed says."""

    kind: Kind = "document"
    instruction: str | None = None
    dimensions: int | None = None
    normalize: bool = True
    show_progress: bool = False
    truncate: Truncate | None = None
    timeout: float | None = None
    output: Output | Sequence[Output] = "dense"
    precision: Precision = "float32"
    ranges: np.ndarray | None = None
    calibration_embeddings: np.ndarray | None = None


@dataclass(frozen=True, kw_only=True, eq=False)
class ScoreRequest:
    """One ``score`` call's options: ``instruction`` for the models that take one, ``truncate`` None the engine's
    default, ``timeout`` a remote call's bound (a local engine refuses one), ``output="multi_vector"`` late
    interaction."""

    instruction: str | None = None
    truncate: Truncate | None = None
    timeout: float | None = None
    output: ScoreOutput = "dense"


@dataclass(frozen=True, kw_only=True, eq=False)
class RerankRequest(ScoreRequest):
    """One ``rerank`` call's options: a score request and how many of the best to keep (None: all)."""

    top_n: int | None = None


def check_no_timeout(engine: str, timeout: float | None) -> None:
    """A local engine computes and waits on no server: a timeout is a remote engine's option only."""
    if timeout is not None:
        raise TypeError(f"{engine} takes no timeout (it waits on no server); timeout applies to remote engines.")
