"""Jina's (and vLLM's) rerank routes: /v1/rerank and /rerank rank ``documents`` (texts, or ``{"text"}`` objects)
against ``query``, best first, ``top_n`` of them, with ``usage``. /rerank is also TEI's: a body with ``texts`` instead
of ``documents`` is TEI's request and gets TEI's answer (tei_routes.rerank), on either route, as the schema declares.

Imports: server (check, engine_calls, openai_routes, responses, routes, tei_routes), text (inputs); pydantic.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rbln_retrieval.server import responses as answers
from rbln_retrieval.server import tei_routes
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.engine_calls import scores, token_counts
from rbln_retrieval.server.openai_routes import vllm_truncation
from rbln_retrieval.server.routes import Context, Route
from rbln_retrieval.text.inputs import Truncate


class Document(BaseModel):
    text: str


class RerankRequest(BaseModel):
    """Jina's rerank request; with ``texts`` in place of ``documents`` (on /rerank), TEI's."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    query: str
    documents: list[str | Document] | None = None
    top_n: int | None = Field(default=None, ge=0)
    return_documents: bool = True
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    # TEI's fields
    texts: list[str] | None = None
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool | None = None
    truncation_direction: tei_routes.Direction = "right"


async def rerank(context: Context, request: RerankRequest) -> Any:
    if request.texts is not None and request.documents is None:
        fields = request.model_dump(include=set(tei_routes.RerankRequest.model_fields))
        return await tei_routes.rerank(context, tei_routes.RerankRequest.model_validate(fields))
    if request.documents is None or request.texts is not None:
        raise Refused("Send `query` with `documents` (Jina's rerank) or with `texts` (TEI's), not both.")
    served = context.models.pick(request.model, "score")
    documents = [d if isinstance(d, str) else d.text for d in request.documents]
    # A reranker cuts an over-long document by default, as Jina's and Cohere's do.
    truncate: Truncate = (
        "end"
        if request.truncate_prompt_tokens is None
        else vllm_truncation(served, request.truncate_prompt_tokens, request.truncation_side)
    )
    values = await scores(served, request.query, documents, truncate)
    ranked = sorted(range(len(values)), key=lambda i: -values[i])
    if request.top_n is not None:
        ranked = ranked[: request.top_n]
    tokens = sum(await token_counts(served, [request.query + " " + d for d in documents]))
    results = [
        {"index": i, "relevance_score": values[i]}
        | ({"document": {"text": documents[i]}} if request.return_documents else {})
        for i in ranked
    ]
    return {"id": uuid.uuid4().hex, "model": served.name, "results": results, "usage": {"total_tokens": tokens}}


RerankAnswer = answers.JinaRanking | list[answers.Rank]
ROUTES = (
    Route("/v1/rerank", "POST", "openai", RerankRequest, rerank, "ascore, ranked", RerankAnswer),
    Route("/rerank", "POST", "openai", RerankRequest, rerank, "ascore, ranked (TEI's body: tei /rerank)", RerankAnswer),
)
