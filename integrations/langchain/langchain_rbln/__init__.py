"""LangChain integration for rbln-retrieval: embeddings and reranking on Rebellions RBLN NPUs (or the CPU)."""

from importlib import metadata

from langchain_rbln.embeddings import RBLNEmbeddings
from langchain_rbln.rerank import RBLNReranker

try:
    __version__ = metadata.version("langchain-rbln")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = ""

__all__ = ["RBLNEmbeddings", "RBLNReranker", "RBLNSparseEmbeddings", "__version__"]


def __getattr__(name: str) -> object:
    # RBLNSparseEmbeddings implements langchain-qdrant's interface: imported on first use, so the package works
    # without the qdrant extra.
    if name == "RBLNSparseEmbeddings":
        from langchain_rbln.sparse import RBLNSparseEmbeddings

        return RBLNSparseEmbeddings
    raise AttributeError(f"module 'langchain_rbln' has no attribute {name!r}")
