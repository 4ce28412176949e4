"""Engines for the backend tests: each model gets a bundled (strict_shapes) and a stock engine, started once per
model and closed after its tests; steps of at most 1024 tokens keep warmup to seven buckets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from rbln_retrieval import PoolingEngine
from rbln_retrieval.testing import minilm_path

SETTINGS = {"max_num_batched_tokens": 1024}


def start(path: Path, runner: str, **settings) -> PoolingEngine:
    extra = {"additional_config": {"rbln_retrieval": {**SETTINGS, **settings}}} if runner == "bundled" else {}
    return PoolingEngine(
        path, device="cpu", dtype="float32", runner=runner, strict_shapes=runner == "bundled", engine_kwargs=extra
    )


def model_path(tiny_models, name: str) -> Path:
    return minilm_path() if name == "all-MiniLM-L6-v2" else tiny_models[name]


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory) -> Path:
    """A fresh compile cache for the session (engine processes inherit the variable)."""
    path = tmp_path_factory.mktemp("compile-cache")
    os.environ["RBLN_RETRIEVAL_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def start_engine():
    """``start(path, runner, **bundled_settings)`` for tests that need an engine with other settings."""
    return start


@pytest.fixture(scope="module")
def pair(request, tiny_models) -> Iterator[tuple[Path, PoolingEngine, PoolingEngine]]:
    """(model dir, bundled engine, stock engine) for the module's parameter ``request.param``."""
    path = model_path(tiny_models, request.param)
    bundled = start(path, "bundled")
    stock = None
    try:
        stock = start(path, "stock")
        yield path, bundled, stock
    finally:
        bundled.close()
        if stock is not None:
            stock.close()
