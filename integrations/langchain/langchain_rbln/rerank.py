"""RBLNReranker: a LangChain document compressor that reranks with rbln-retrieval."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import Field

from langchain_rbln._engine import RBLNEngineModel, batches
from rbln_retrieval import ModelFamily, rank
from rbln_retrieval.frameworks.connect import ScoreOptions
from rbln_retrieval.models.source import DEFAULT_RERANKER_MODEL
from rbln_retrieval.results.outputs import check_outputs
from rbln_retrieval.text.prompts import score_method


class RBLNReranker(RBLNEngineModel, BaseDocumentCompressor):
    """Reranker served by rbln-retrieval: cross-encoders, Qwen3-Reranker, or a bi-encoder's cosine similarity.

    Scores are P(relevant) in [0, 1] for cross-encoders and Qwen3-Reranker, cosine similarity in [-1, 1] for
    bi-encoders (embedding models).

    Instantiate:
        ```python
        from langchain_rbln import RBLNReranker

        reranker = RBLNReranker(model="BAAI/bge-reranker-v2-m3", top_n=3)
        ```

    Compress (new Documents, best first, each with `metadata["relevance_score"]`):
        ```python
        best = reranker.compress_documents(documents, "What is an NPU?")
        ```

    With a retriever (`langchain-classic`):
        ```python
        from langchain_classic.retrievers import ContextualCompressionRetriever

        retriever = ContextualCompressionRetriever(
            base_compressor=reranker, base_retriever=vector_store.as_retriever(search_kwargs={"k": 20})
        )
        ```

    Indices and scores only (`rerank` ranks all inputs unless given `top_n`; it ignores the `top_n` and
    `score_threshold` fields, which apply to `compress_documents`):
        ```python
        reranker.rerank(["An NPU is a chip.", "Paris is in France."], "What is an NPU?")
        # [{"index": 0, "relevance_score": 0.93}, {"index": 1, "relevance_score": 0.01}]
        ```
    """

    model: str = Field(default=DEFAULT_RERANKER_MODEL, alias="model_name")
    """Hugging Face model id (`org/name`, or `org/name@revision`) resolved through the Hugging Face cache, or a
    local model directory; with `base_url`, the model's name on the server. Default: BAAI/bge-reranker-base."""

    top_n: int | None = 3
    """Documents `compress_documents` returns; None returns all of them, 0 or less returns []."""

    score_threshold: float | None = Field(default=None, allow_inf_nan=False)
    """`compress_documents` drops documents scoring below this; None keeps every score (NaN and infinities are
    rejected: no score compares usefully with them)."""

    instruction: str | None = None
    """Task description for Qwen3-Reranker (None: the model's default task) or the query prompt for a
    bi-encoder (None: the model's own). Plain cross-encoders take none."""

    late_interaction: bool = False
    """bge-m3: score by MaxSim over its ColBERT multi-vectors (late interaction) instead of dense cosine. ColBERT
    checkpoints (HF_ColBERT) have no other way to score and always use it, with or without this flag."""

    def _check_family(self, family: ModelFamily) -> None:
        score_method(family, self.model, self.instruction)  # refuses an instruction the family cannot take
        if self.late_interaction:
            check_outputs("multi_vector", family=family.name, model=self.model)

    def _score_options(self) -> ScoreOptions:
        output: Literal["dense", "multi_vector"] = "multi_vector" if self.late_interaction else "dense"
        # Read at each call, so that assigning them takes effect.
        return {"instruction": self.instruction, "output": output, "truncate": self.truncate, "timeout": self.timeout}

    def rerank(self, documents: Sequence[str | Document], query: str, top_n: int | None = None) -> list[dict[str, Any]]:
        """Rank `documents` (strings or Documents) by relevance to `query`, best first.

        Returns `{"index": <position in documents>, "relevance_score": <float>}` dicts; `top_n` None ranks all
        documents and 0 or less returns []. Empty input returns [] without calling the engine.
        """
        texts = _page_contents(documents, strings_allowed=True)
        if not texts or (top_n is not None and top_n <= 0):
            return []
        scores: list[float] = []
        for batch in batches(texts, self.batch_size):
            scores.extend(self.engine.score(query, batch, **self._score_options()))
        return _ranked_dicts(scores, top_n)

    async def arerank(
        self, documents: Sequence[str | Document], query: str, top_n: int | None = None
    ) -> list[dict[str, Any]]:
        """Async `rerank`: awaits the engine without blocking the event loop or using a thread."""
        texts = _page_contents(documents, strings_allowed=True)
        if not texts or (top_n is not None and top_n <= 0):
            return []
        scores: list[float] = []
        for batch in batches(texts, self.batch_size):
            scores.extend(await self.engine.ascore(query, batch, **self._score_options()))
        return _ranked_dicts(scores, top_n)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """The `top_n` most relevant documents scoring at least `score_threshold`, best first.

        Returns new Documents whose metadata is a deep copy of the input's plus `relevance_score`; the input
        documents are not modified.
        """
        _page_contents(documents, strings_allowed=False)
        return self._selected(documents, self.rerank(documents, query, top_n=self.top_n))

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        """Async `compress_documents`."""
        _page_contents(documents, strings_allowed=False)
        return self._selected(documents, await self.arerank(documents, query, top_n=self.top_n))

    def _selected(self, documents: Sequence[Document], ranked: list[dict[str, Any]]) -> list[Document]:
        out = []
        for result in ranked:
            if self.score_threshold is not None and result["relevance_score"] < self.score_threshold:
                break  # ranked is best first: every later score is lower too
            document = documents[result["index"]]
            metadata = copy.deepcopy(document.metadata)
            metadata["relevance_score"] = result["relevance_score"]
            out.append(document.model_copy(update={"metadata": metadata}))
        return out


def _page_contents(documents: Sequence[str | Document], *, strings_allowed: bool) -> list[str]:
    expected = "str or Document" if strings_allowed else "Document"
    if isinstance(documents, Mapping):
        raise TypeError(f"documents must be a sequence of {expected} objects, not a {type(documents).__name__}.")
    if isinstance(documents, (str, Document)):
        raise TypeError(f"documents must be a sequence of {expected} objects, not a single {type(documents).__name__}.")
    texts = []
    for index, document in enumerate(documents):
        if isinstance(document, Document):
            texts.append(document.page_content)
        elif strings_allowed and isinstance(document, str):
            texts.append(document)
        else:
            raise TypeError(f"documents[{index}] is {type(document).__name__}, expected {expected}.")
    return texts


def _ranked_dicts(scores: list[float], top_n: int | None) -> list[dict[str, Any]]:
    return [{"index": i, "relevance_score": score} for i, score in rank(scores, top_n)]
