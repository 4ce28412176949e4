"""Shared fixtures: models are built once per session and engines are shared, because an engine start costs
~20 s on this machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from rbln_retrieval import PoolingEngine  # noqa: E402
from rbln_retrieval.testing import BUILDERS, minilm_path  # noqa: E402


class TinyModels:
    """Builds each tiny model directory the first time a test asks for it."""

    def __init__(self, root: Path):
        self.root = root

    def __getitem__(self, name: str) -> Path:
        path = self.root / name
        if not (path / "config.json").exists():
            BUILDERS[name](path)
        return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def minilm_engine(minilm) -> PoolingEngine:
    return PoolingEngine.shared(minilm, device="cpu", dtype="float32")
