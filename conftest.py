"""Fixtures for every test folder (core, backend, integrations): test models are built once per session, since
each build and each engine start costs seconds to tens of seconds on this machine."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from rbln_retrieval.testing import BUILDERS, minilm_path  # noqa: E402


class TinyModels:
    """``tiny_models[name]`` builds rbln_retrieval.testing.BUILDERS[name] the first time it is asked for."""

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
def tiny_model(tiny_models) -> Callable[[str], Path]:
    return tiny_models.__getitem__


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def cpu() -> dict[str, Any]:
    """Engine options for framework objects in tests: the CPU in float32, so results compare with references."""
    return {"device": "cpu", "dtype": "float32"}
