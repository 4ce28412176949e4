"""The shared all-MiniLM-L6-v2 engine of the core tests (an engine start costs ~20 s on this machine)."""

from __future__ import annotations

import pytest

from rbln_retrieval import PoolingEngine


@pytest.fixture(scope="session")
def minilm_engine(minilm) -> PoolingEngine:
    return PoolingEngine.shared(minilm, device="cpu", dtype="float32")
