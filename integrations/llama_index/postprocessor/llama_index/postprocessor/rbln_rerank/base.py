"""RBLNReranker: a LlamaIndex node postprocessor that reranks on Rebellions RBLN NPUs (or the CPU)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any, ClassVar

from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.callbacks import CBEventType, EventPayload
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.rerank import ReRankEndEvent, ReRankStartEvent
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle

from rbln_retrieval import rank
from rbln_retrieval.frameworks.connect import ScoreOptions
from rbln_retrieval.frameworks.settings import ENGINE_SETTINGS, EngineSettings
from rbln_retrieval.models.source import DEFAULT_RERANKER_MODEL

dispatcher = get_dispatcher(__name__)

RETRIEVAL_SCORE_KEY = "retrieval_score"


class RBLNReranker(EngineSettings, BaseNodePostprocessor):
    """Rerank retrieved nodes with a cross-encoder, Qwen3-Reranker or bi-encoder served by rbln-retrieval.

    Scores are P(relevant) for cross-encoders and Qwen3-Reranker, cosine similarity for bi-encoders. Returns new
    NodeWithScore objects, best first; the input list and its NodeWithScore objects are left as they were.
    Objects with equal engine settings share one engine; ``close()`` (or a ``with`` block) releases this object's
    claim, and the engine closes with its last holder or at exit. Objects pickle and rejoin on first use.

    Examples:
        ```python
        from llama_index.postprocessor.rbln_rerank import RBLNReranker

        reranker = RBLNReranker(model="BAAI/bge-reranker-v2-m3", top_n=3)
        query_engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[reranker])
        ```
    """

    _frozen_fields: ClassVar[frozenset[str]] = ENGINE_SETTINGS | {"model"}

    model: str = Field(
        default=DEFAULT_RERANKER_MODEL,
        description=(
            "Hugging Face id ('org/name' or 'org/name@revision', resolved through the Hugging Face cache), a model "
            "directory, or the model's name on a remote server. Default: BAAI/bge-reranker-base."
        ),
    )
    top_n: int | None = Field(
        default=3, description="Nodes to return, best first; None returns all, 0 or less returns none."
    )
    score_threshold: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Drop nodes whose rerank score is below this value (a finite number; None keeps all).",
    )
    keep_retrieval_score: bool = Field(
        default=False,
        description="Copy each node and keep its retrieval score in metadata['retrieval_score'].",
    )
    instruction: str | None = Field(
        default=None,
        description=(
            "Qwen3-Reranker: the task description (None uses the model's default). Bi-encoders: the query prefix. "
            "Cross-encoders take none."
        ),
    )
    late_interaction: bool = Field(
        default=False,
        description=(
            "bge-m3: score by MaxSim over its ColBERT multi-vectors instead of dense cosine. ColBERT checkpoints "
            "(HF_ColBERT) always score this way."
        ),
    )
    batch_size: int = Field(
        default=1024, gt=0, description="Nodes per engine call (the engine's scheduler batches within a call)."
    )

    _engine: Any = PrivateAttr(default=None)

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        handle = self._claim(self.model)
        handle.engine  # noqa: B018 - start (or join) the engine now, so a bad model fails here
        self._engine = handle

    @field_validator("model", mode="before")
    @classmethod
    def _path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @classmethod
    def class_name(cls) -> str:
        return "RBLNReranker"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query, payload = self._start(nodes, query_bundle)
        if not nodes or self._top_n == 0:  # nothing to score: the engine is never called
            return self._end([])
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            scores = [s for b in self._batches(nodes) for s in self._engine.score(query, b, **self._call_options())]
            result = self._select(nodes, scores)
            event.on_end(payload={EventPayload.NODES: result})
        return self._end(result)

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query, payload = self._start(nodes, query_bundle)
        if not nodes or self._top_n == 0:
            return self._end([])
        with self.callback_manager.event(CBEventType.RERANKING, payload=payload) as event:
            # All batches are awaited together, so the engine schedules them as one workload.
            batches = await asyncio.gather(
                *(self._engine.ascore(query, b, **self._call_options()) for b in self._batches(nodes))
            )
            result = self._select(nodes, [s for scores in batches for s in scores])
            event.on_end(payload={EventPayload.NODES: result})
        return self._end(result)

    # -- shared by the sync and async paths ----------------------------------------------------------------------
    def _call_options(self) -> ScoreOptions:
        # Read at each call, so that assigning these fields takes effect.
        return {
            "instruction": self.instruction,
            "truncate": self.truncate,
            "timeout": self.timeout,
            "output": "multi_vector" if self.late_interaction else "dense",
        }

    @property
    def _top_n(self) -> int | None:
        return None if self.top_n is None else max(self.top_n, 0)

    def _start(self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None) -> tuple[str, dict[str, Any]]:
        """Check the query, emit ReRankStartEvent; return the query and the RERANKING callback payload."""
        if query_bundle is None:
            raise ValueError("RBLNReranker needs a query: pass query_bundle or query_str to postprocess_nodes.")
        top_n = len(nodes) if self._top_n is None else self._top_n
        dispatcher.event(ReRankStartEvent(query=query_bundle, nodes=nodes, top_n=top_n, model_name=self.model))
        query = query_bundle.query_str
        payload = {
            EventPayload.NODES: nodes,
            EventPayload.MODEL_NAME: self.model,
            EventPayload.QUERY_STR: query,
            EventPayload.TOP_K: top_n,
        }
        return query, payload

    def _end(self, result: list[NodeWithScore]) -> list[NodeWithScore]:
        dispatcher.event(ReRankEndEvent(nodes=result))
        return result

    def _batches(self, nodes: list[NodeWithScore]) -> Iterator[list[str]]:
        texts = [n.node.get_content(metadata_mode=MetadataMode.EMBED) for n in nodes]
        for start in range(0, len(texts), self.batch_size):
            yield texts[start : start + self.batch_size]

    def _select(self, nodes: list[NodeWithScore], scores: list[float]) -> list[NodeWithScore]:
        """New NodeWithScore objects, best first (ties keep retrieval order), after threshold and top_n."""
        ranked = [(i, s) for i, s in rank(scores) if self.score_threshold is None or s >= self.score_threshold]
        return [NodeWithScore(node=self._result_node(nodes[i]), score=s) for i, s in ranked[: self._top_n]]

    def _result_node(self, original: NodeWithScore) -> BaseNode:
        if not self.keep_retrieval_score:
            return original.node
        # A copy: the retrieved node may be the docstore's own object, which must not change.
        node = original.node.model_copy()
        node.metadata = {**original.node.metadata, RETRIEVAL_SCORE_KEY: original.score}
        # Bookkeeping, not content: keep it out of the text the LLM and embedders see.
        node.excluded_llm_metadata_keys = [*original.node.excluded_llm_metadata_keys, RETRIEVAL_SCORE_KEY]
        node.excluded_embed_metadata_keys = [*original.node.excluded_embed_metadata_keys, RETRIEVAL_SCORE_KEY]
        return node
