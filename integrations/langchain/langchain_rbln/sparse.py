"""RBLNSparseEmbeddings: bge-m3's sparse lexical weights as langchain-qdrant's ``SparseEmbeddings``, for
QdrantVectorStore's sparse and hybrid retrieval modes (needs the ``qdrant`` extra: ``pip install
"langchain-rbln[qdrant]"``)."""

from __future__ import annotations

from typing import Literal

from langchain_qdrant.sparse_embeddings import SparseEmbeddings, SparseVector
from pydantic import Field

from langchain_rbln._engine import RBLNEngineModel, batches
from langchain_rbln.embeddings import _check_text
from rbln_retrieval import ModelFamily
from rbln_retrieval.frameworks.connect import EmbedOptions
from rbln_retrieval.models.source import DEFAULT_SPARSE_MODEL
from rbln_retrieval.results.outputs import check_outputs
from rbln_retrieval.text.inputs import check_texts


class RBLNSparseEmbeddings(RBLNEngineModel, SparseEmbeddings):
    """Sparse lexical weights ({token id: weight}, bge-m3's recipe) from rbln-retrieval's pooling engine.

    Needs a model with a sparse head (BAAI/bge-m3: `sparse_linear.pt` beside the weights); any other model is
    refused at construction in one sentence. It shares the engine with an `RBLNEmbeddings` of the same model and
    engine settings, so dense and sparse vectors of one corpus cost one engine. Local engines only: vLLM's
    server gives dense vectors only.

    Instantiate:
        ```python
        from langchain_qdrant import QdrantVectorStore, RetrievalMode
        from langchain_rbln import RBLNEmbeddings, RBLNSparseEmbeddings

        dense = RBLNEmbeddings(model="BAAI/bge-m3")
        sparse = RBLNSparseEmbeddings(model="BAAI/bge-m3")
        store = QdrantVectorStore.from_texts(texts, dense, sparse_embedding=sparse, location=":memory:",
                                             retrieval_mode=RetrievalMode.HYBRID, collection_name="docs")
        ```
    """

    model: str = Field(default=DEFAULT_SPARSE_MODEL, alias="model_name")
    """Hugging Face model id (`org/name`, or `org/name@revision`) or local model directory of a model with a sparse
    head. Default: BAAI/bge-m3."""

    query_instruction: str | None = None
    """None applies the model's own query prompt (bge-m3: none); a string is placed before each query."""

    document_instruction: str | None = None
    """None applies the model's own document prompt (bge-m3: none); a string is placed before each document."""

    def _check_family(self, family: ModelFamily) -> None:
        check_outputs("sparse", family=family.name, model=self.model)

    def embed_documents(self, texts: list[str]) -> list[SparseVector]:
        """One sparse vector per text, in input order."""
        texts = check_texts(texts)
        return [
            _vector(w)
            for batch in batches(texts, self.batch_size)
            for w in self.engine.embed(batch, **self._options("document"))
        ]

    def embed_query(self, text: str) -> SparseVector:
        return _vector(self.engine.embed([_check_text(text)], **self._options("query"))[0])

    async def aembed_documents(self, texts: list[str]) -> list[SparseVector]:
        """Async `embed_documents`: awaits the engine without a thread."""
        texts = check_texts(texts)
        vectors: list[SparseVector] = []
        for batch in batches(texts, self.batch_size):
            vectors.extend(_vector(w) for w in await self.engine.aembed(batch, **self._options("document")))
        return vectors

    async def aembed_query(self, text: str) -> SparseVector:
        return _vector((await self.engine.aembed([_check_text(text)], **self._options("query")))[0])

    def _options(self, kind: Literal["document", "query"]) -> EmbedOptions:
        instruction = self.query_instruction if kind == "query" else self.document_instruction
        return {
            "kind": kind,
            "instruction": instruction,
            "output": "sparse",
            # Read at each call, so that assigning them takes effect.
            "truncate": self.truncate,
            "timeout": self.timeout,
        }


def _vector(weights: dict[int, float]) -> SparseVector:
    indices = sorted(weights)
    return SparseVector(indices=indices, values=[weights[i] for i in indices])


__all__ = ["RBLNSparseEmbeddings"]
