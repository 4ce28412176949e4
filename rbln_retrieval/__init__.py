"""rbln-retrieval: embeddings and rerankers on Rebellions RBLN NPUs (and the CPU) through a bundled vLLM backend.

The public API: the names below, re-exported from the rooms that define them (each room's __init__ says what it is
and what it may import).

May import: errors, models, results, text, engines, local, frameworks
Engine libraries: none
"""

import os as _os
from importlib.util import find_spec as _find_spec

# torch-rbln registers itself on `import torch` and makes that import fail where rebel-compiler is absent (a CPU or
# compile-only host with the SDK's Python packages): with no runtime there is nothing to load.
if _find_spec("torch_rbln") is not None and _find_spec("rebel") is None:
    _os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import RetrievalEngine
from rbln_retrieval.errors import (
    DeviceUnavailableError,
    EngineDeadError,
    EngineStartError,
    ModelNotFoundError,
    ModelNotSupportedError,
    RBLNRetrievalError,
)
from rbln_retrieval.frameworks.connect import get_engine
from rbln_retrieval.frameworks.settings import EngineHolder
from rbln_retrieval.local.engine import PoolingEngine
from rbln_retrieval.models.families import ModelFamily, detect_family
from rbln_retrieval.models.source import ModelSource, resolve_model
from rbln_retrieval.results.finite import NonFiniteResultError
from rbln_retrieval.results.quantize import quantization_ranges, quantize_embeddings
from rbln_retrieval.results.ranking import rank
from rbln_retrieval.results.windows import ChunkedEmbedding
from rbln_retrieval.text.inputs import Chunk

__all__ = [
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
]
__version__ = "0.1.0"
