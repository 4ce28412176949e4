"""Each package's public names, pinned, and what importing the core costs (no vLLM, torch or transformers)."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

PUBLIC = {
    "rbln_retrieval": [
        "Chunk",
        "ChunkedEmbedding",
        "DeviceUnavailableError",
        "EngineDeadError",
        "EngineHolder",
        "EngineOptions",
        "EngineStartError",
        "ModelFamily",
        "ModelNotFoundError",
        "ModelNotSupportedError",
        "ModelSource",
        "NonFiniteResultError",
        "PoolingEngine",
        "RBLNRetrievalError",
        "RetrievalEngine",
        "detect_family",
        "get_engine",
        "quantization_ranges",
        "quantize_embeddings",
        "rank",
        "resolve_model",
    ],
    "rbln_retrieval.ray": ["BatchFailedError", "embed_dataset", "engine_resources", "score_dataset"],
    "langchain_rbln": ["RBLNEmbeddings", "RBLNReranker", "RBLNSparseEmbeddings", "__version__"],
    "llama_index.embeddings.rbln": ["RBLNEmbedding", "RBLNMultiModalEmbedding", "RBLNSparseEmbedding"],
    "llama_index.postprocessor.rbln_rerank": ["RBLNReranker"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_are_pinned(package):
    module = __import__(package, fromlist=["__all__"])
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_importing_the_core_and_the_integrations_loads_no_engine_library():
    code = (
        "import sys, rbln_retrieval, langchain_rbln, llama_index.embeddings.rbln, "
        "llama_index.postprocessor.rbln_rerank;"
        "print(' '.join(m for m in ('vllm', 'torch', 'transformers', 'ray', 'qdrant_client') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == []


@pytest.mark.parametrize("method", ["embed", "aembed", "score", "ascore", "rerank", "arerank"])
def test_every_engine_takes_the_same_call_options(method):
    """PoolingEngine, RemoteEngine, the shared-engine handle and the RetrievalEngine protocol take one signature: the
    typed options of rbln_retrieval.engines.requests."""
    from rbln_retrieval import PoolingEngine, RetrievalEngine
    from rbln_retrieval.engines.shared import EngineHandle
    from rbln_retrieval.remote import RemoteEngine

    signatures = {
        cls.__name__: str(inspect.signature(getattr(cls, method)))
        for cls in (PoolingEngine, RemoteEngine, EngineHandle, RetrievalEngine)
    }
    assert len(set(signatures.values())) == 1, signatures
    assert "**options: 'Unpack[" in signatures["PoolingEngine"]


def test_a_call_option_the_engines_do_not_know_is_refused():
    """The options arrive as keywords: a misspelt one fails as it did when each was a parameter."""
    from rbln_retrieval.engines.requests import EmbedRequest, RerankRequest, ScoreRequest

    for request in (EmbedRequest, ScoreRequest, RerankRequest):
        with pytest.raises(TypeError, match="normalise"):
            request(normalise=True)
