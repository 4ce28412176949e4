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
    compared = "multi_vector" if output == "multi_vector" or family.late_interaction_only else method.compares
    if compared is None:  # the model reads each pair: inside the family's template when it has one
        score_pairs = scorer.score_pairs if family.spec.pair_template is None else scorer.score_template
        return await score_pairs(query, documents, family=family, instruction=instruction, truncate=truncate)
    if compared != "dense":
        scorer.check_outputs(compared, family=family.name, model=scorer.model)
    docs = await scorer.embed(documents, EmbedRequest(output=compared), truncate=truncate, what="documents")
    if len(docs) == 0:
        return []
    query_request = EmbedRequest(kind="query", instruction=instruction, output=compared)
    (q,) = await scorer.embed([query], query_request, truncate=truncate, what="texts")
    return compare(compared, q, docs, family)


def compare(output: Output, query: Any, documents: Any, family: ModelFamily) -> list[float]:
    """The score of each document's ``output`` against the query's: the dot product of dense or sparse vectors, or
    MaxSim over token vectors (reduced as the family's spec says)."""
    if output == "sparse":
        return [sparse_dot(query, d) for d in documents]
    if output == "multi_vector":
        return [maxsim(query, d, family=family.name) for d in documents]
    return [float(s) for s in documents @ query]
