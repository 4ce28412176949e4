"""RBLNSparseEmbedding: bge-m3's sparse lexical weights as a LlamaIndex ``BaseSparseEmbedding``."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Literal

from llama_index.core.base.embeddings.base_sparse import BaseSparseEmbedding, SparseEmbedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator

from llama_index.embeddings.rbln.base import DEFAULT_RBLN_EMBED_BATCH_SIZE
from rbln_retrieval.frameworks.connect import EmbedOptions
from rbln_retrieval.frameworks.settings import ENGINE_SETTINGS, EngineSettings
from rbln_retrieval.models.source import DEFAULT_SPARSE_MODEL
from rbln_retrieval.results.outputs import check_outputs


class RBLNSparseEmbedding(EngineSettings, BaseSparseEmbedding):
    """Sparse lexical weights ({token id: weight}, bge-m3's recipe) from rbln-retrieval's pooling engine.

    Needs a model with a sparse head (BAAI/bge-m3: ``sparse_linear.pt`` beside the weights); any other model is
    refused at construction in one sentence. Shares the engine with an ``RBLNEmbedding`` of the same model and
    engine options. Local engines only: vLLM's server gives dense vectors only.

    Examples:
        ```python
        from llama_index.embeddings.rbln import RBLNEmbedding, RBLNSparseEmbedding

        dense = RBLNEmbedding(model_name="BAAI/bge-m3")
        sparse = RBLNSparseEmbedding(model_name="BAAI/bge-m3")
        sparse.get_query_embedding("What is an NPU?")  # {token_id: weight}
        ```
    """

    _frozen_fields: ClassVar[frozenset[str]] = ENGINE_SETTINGS | {"model_name"}

    model_name: str = Field(
        description="Hugging Face id ('org/name[@revision]') or a model directory of a model with a sparse head. "
        "Default: BAAI/bge-m3."
    )
    embed_batch_size: int = Field(
        default=DEFAULT_RBLN_EMBED_BATCH_SIZE, gt=0, le=2048, description="Texts per engine call."
    )
    query_instruction: str | None = Field(
        default=None, description="None applies the model's own query prompt; a string is the literal prefix."
    )
    text_instruction: str | None = Field(
        default=None, description="None applies the model's own document prompt; a string is the literal prefix."
    )

    _engine: Any = PrivateAttr(default=None)

    def __init__(self, model_name: str | os.PathLike[str] | None = None, **kwargs: Any):
        super().__init__(model_name=DEFAULT_SPARSE_MODEL if model_name is None else model_name, **kwargs)
        handle = self._claim(self.model_name)
        family = handle.spec.family  # the resolved snapshot's, read once by get_engine; None for a remote model
        if family is not None:  # refuse a model without a sparse head before an engine starts
            check_outputs("sparse", family=family.name, model=self.model_name)
        handle.engine  # noqa: B018 - start (or join) the engine now, so a bad model fails here
        self._engine = handle

    @field_validator("model_name", mode="before")
    @classmethod
    def _path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @classmethod
    def class_name(cls) -> str:
        return "RBLNSparseEmbedding"

    def _options(self, kind: Literal["document", "query"]) -> EmbedOptions:
        return {
            "kind": kind,
            "instruction": self.query_instruction if kind == "query" else self.text_instruction,
            "output": "sparse",
            "truncate": self.truncate,
            "timeout": self.timeout,
        }

    def _get_query_embedding(self, query: str) -> SparseEmbedding:
        return self._engine.embed([query], **self._options("query"))[0]

    async def _aget_query_embedding(self, query: str) -> SparseEmbedding:
        return (await self._engine.aembed([query], **self._options("query")))[0]

    def _get_text_embedding(self, text: str) -> SparseEmbedding:
        return self._get_text_embeddings([text])[0]

    async def _aget_text_embedding(self, text: str) -> SparseEmbedding:
        return (await self._aget_text_embeddings([text]))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[SparseEmbedding]:
        return self._engine.embed(texts, **self._options("document"))

    async def _aget_text_embeddings(self, texts: list[str]) -> list[SparseEmbedding]:
        return await self._engine.aembed(texts, **self._options("document"))
