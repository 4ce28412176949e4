"""How a query scores against documents, decided once for every engine: a document's best window (chunked), late
interaction (MaxSim over multi-vectors), the dot product of sparse vectors, the cosine of embeddings, or the model
reading each (query, document) pair (a cross-encoder, or a template reranker reading its family's template around
the pair).

The engines differ only in how they pool (local: vLLM's engine in this process; remote: a server over HTTP): each
hands the router a Scorer holding its family, the tokenizer windows are cut with, which token-level outputs it
gives, and its embedding and pair-scoring steps. The router decides everything else, once.

Imports: engines (requests, windows), models (families, spec), results (outputs), text (chunks, inputs, prompts,
tokens).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from rbln_retrieval.engines.requests import EmbedRequest, ScoreRequest
from rbln_retrieval.engines.windows import score_windowed
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.spec import Scoring
from rbln_retrieval.results.outputs import Output, maxsim, sparse_dot
from rbln_retrieval.text.chunks import score_windows
from rbln_retrieval.text.inputs import Truncate, check_query, chunking
from rbln_retrieval.text.prompts import score_method
from rbln_retrieval.text.tokens import PromptTokenizer


class CheckOutputs(Protocol):
    def __call__(self, output: Any, *, family: str, model: str) -> object: ...


class EmbedRows(Protocol):
    def __call__(
        self, texts: Iterable[str], request: EmbedRequest, *, truncate: Truncate, what: str = ...
    ) -> Awaitable[Any]: ...


class ScorePairs(Protocol):
    def __call__(
        self, query: str, documents: Iterable[str], *, family: ModelFamily, instruction: str | None, truncate: Truncate
    ) -> Awaitable[list[float]]: ...


@dataclass(frozen=True, kw_only=True)
class Scorer:
    """What differs between engines, as the router uses it: the model, its family (a remote engine asks the
    server), the tokenizer windows are cut with, which token-level outputs the engine gives (``check_outputs``
    refuses the others), ``embed`` (an EmbedRequest's output for texts; empty input, empty result), and the finite
    scores, in input order, of a cross-encoder reading (query, document) pairs and of a template reranker reading
    its family's template around them."""

    model: str
    family: Callable[[], Awaitable[ModelFamily]]
    tokenizer: Callable[[ModelFamily], Awaitable[PromptTokenizer]]
    check_outputs: CheckOutputs
    embed: EmbedRows
    score_pairs: ScorePairs
    score_template: ScorePairs


async def score(
    scorer: Scorer,
    query: str,
    documents: Iterable[str],
    *,
    request: ScoreRequest,
    truncate: Truncate,
) -> list[float]:
    """Relevance of each document to ``query``, in input order, the way the model scores; ``truncate`` is the
    call's, resolved (``request.truncate`` may leave it to the engine's default)."""
    query = check_query(query)
    family = await scorer.family()
    instruction, output = request.instruction, request.output
    if chunked := chunking(truncate):  # a document's best window, each window scored as a document that fits

        async def windows_scores(pieces: list[str]) -> list[float]:
            return await score(scorer, query, pieces, request=request, truncate="end")

        windows = score_windows(await scorer.tokenizer(family), scorer.model, query, instruction, chunked)
        return await score_windowed(windows, documents, chunked, score=windows_scores, output=output)
    method = score_method(family, scorer.model, instruction)
    if output not in ("dense", "multi_vector"):
        raise ValueError(f"score takes output='dense' or 'multi_vector', not {output!r}.")
    late: Output | None = None
    if output == "multi_vector" or family.late_interaction_only:
        late = "multi_vector"
    elif method is Scoring.SPARSE_DOT:
        late = "sparse"
    if late is not None:
        scorer.check_outputs(late, family=family.name, model=scorer.model)
        docs = await scorer.embed(documents, EmbedRequest(output=late), truncate=truncate, what="documents")
        if not docs:
            return []
        query_request = EmbedRequest(kind="query", instruction=instruction, output=late)
        (q,) = await scorer.embed([query], query_request, truncate=truncate, what="texts")
        if late == "sparse":
            return [sparse_dot(q, d) for d in docs]
        return [maxsim(q, d, family=family.name) for d in docs]
    if method.embeds:
        vectors = await scorer.embed(documents, EmbedRequest(), truncate=truncate, what="documents")
        if len(vectors) == 0:
            return []
        q = await scorer.embed(
            [query], EmbedRequest(kind="query", instruction=instruction), truncate=truncate, what="texts"
        )
        return [float(s) for s in vectors @ q[0]]
    score_pairs = scorer.score_template if method is Scoring.TEMPLATE else scorer.score_pairs
    return await score_pairs(query, documents, family=family, instruction=instruction, truncate=truncate)
