"""rbln-retrieval: embeddings and rerankers on Rebellions RBLN NPUs (and the CPU) through a bundled vLLM backend."""

from rbln_retrieval.connect import get_engine
from rbln_retrieval.engine import EngineOptions, PoolingEngine
from rbln_retrieval.errors import (
    DeviceUnavailableError,
    EngineDeadError,
    EngineStartError,
    ModelNotSupportedError,
    RBLNRetrievalError,
)
from rbln_retrieval.families import ModelFamily, detect_family

__all__ = [
    "DeviceUnavailableError",
    "EngineDeadError",
    "EngineOptions",
    "EngineStartError",
    "ModelFamily",
    "ModelNotSupportedError",
    "PoolingEngine",
    "RBLNRetrievalError",
    "detect_family",
    "get_engine",
]
__version__ = "0.1.0"
