"""rbln-retrieval: embeddings and rerankers on Rebellions RBLN NPUs (and the CPU) through a bundled vLLM backend."""

import os as _os
from importlib.util import find_spec as _find_spec

# torch-rbln registers itself on `import torch` and makes that import fail where rebel-compiler is absent (a CPU or
# compile-only host with the SDK's Python packages): with no runtime there is nothing to load.
if _find_spec("torch_rbln") is not None and _find_spec("rebel") is None:
    _os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from rbln_retrieval.connect import get_engine
from rbln_retrieval.engine import PoolingEngine
from rbln_retrieval.errors import (
    DeviceUnavailableError,
    EngineDeadError,
    EngineStartError,
    ModelNotFoundError,
    ModelNotSupportedError,
    RBLNRetrievalError,
)
from rbln_retrieval.families import ModelFamily, detect_family
from rbln_retrieval.model_source import ModelSource, resolve_model
from rbln_retrieval.options import EngineOptions
from rbln_retrieval.protocol import RetrievalEngine
from rbln_retrieval.ranking import rank
from rbln_retrieval.shared import EngineHolder

__all__ = [
    "DeviceUnavailableError",
    "EngineDeadError",
    "EngineHolder",
    "EngineOptions",
    "EngineStartError",
    "ModelFamily",
    "ModelNotFoundError",
    "ModelNotSupportedError",
    "ModelSource",
    "PoolingEngine",
    "RBLNRetrievalError",
    "RetrievalEngine",
    "detect_family",
    "get_engine",
    "rank",
    "resolve_model",
]
__version__ = "0.1.0"
