"""Session-wide models and objects: an engine start costs ~20 s here, and objects with equal settings share one
engine through rbln_retrieval.get_engine, so every test below reuses a handful of engines."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from rbln_retrieval.testing import BUILDERS, minilm_path  # noqa: E402

from langchain_rbln import RBLNEmbeddings, RBLNReranker  # noqa: E402

# Every test object uses these, so all of them land on the same few shared engines.
CPU: dict[str, Any] = {"device": "cpu", "dtype": "float32"}


@pytest.fixture(scope="session")
def cpu() -> dict[str, Any]:
    return dict(CPU)


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_path()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Callable[[str], Path]:
    """Path of a tiny random-weight model of rbln_retrieval.testing.BUILDERS, built on first request."""
    root = tmp_path_factory.mktemp("tiny-models")

    def path(name: str) -> Path:
        target = root / name
        if not (target / "config.json").exists():
            BUILDERS[name](target)
        return target

    return path


@pytest.fixture(scope="session")
def minilm_embeddings(minilm) -> RBLNEmbeddings:
    return RBLNEmbeddings(model=minilm, **CPU)


@pytest.fixture(scope="session")
def cross_encoder_reranker(tiny_model) -> RBLNReranker:
    return RBLNReranker(model=tiny_model("bert-cross-encoder"), top_n=None, **CPU)
