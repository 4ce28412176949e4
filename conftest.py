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

from model_builders import (
    BUILDERS,
    HUB_MINILM,
    HUB_TINY,
    HUB_TINY_RERANKER,
    hub_cache_snapshot,
    minilm_path,
)

# Engine and server starts per session, against the limits docs/development.md states; the two-worker lane's
# grouping and threads; pytester for their tests.
pytest_plugins = ["engine_budget", "workers", "timeline", "pytester"]


class TinyModels:
    """``tiny_models[name]`` builds model_builders.BUILDERS[name] the first time it is asked for."""

    def __init__(self, root: Path):
        self.root = root

    def __getitem__(self, name: str) -> Path:
        path = self.root / name
        if not (path / "config.json").exists():
            BUILDERS[name](path)
        return path


def pytest_configure(config: pytest.Config) -> None:
    """vllm-rbln (installed, as on an NPU host) would become vLLM's platform on this process's first bare vLLM
    import, and it needs rebel-compiler, which this environment does not have. The test process resolves vLLM's CPU
    platform once, before collection imports any test module, under a plugin choice scoped to that call (as
    `rbln-retrieval serve` does for its own), so tests may import vLLM directly while every process they start
    sees the environment a user has."""
    from rbln_retrieval import backend

    backend.pin_platform(None)


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
def hub_cache(tmp_path_factory, minilm, tiny_models) -> Path:
    """A Hugging Face cache folder (blobs, snapshots, refs) holding all-MiniLM-L6-v2 and tiny models by id."""
    cache = tmp_path_factory.mktemp("hf-cache")
    hub_cache_snapshot(cache, HUB_MINILM, minilm)
    hub_cache_snapshot(cache, HUB_TINY, tiny_models["bert-cls"], refs=("main",))
    hub_cache_snapshot(cache, HUB_TINY, tiny_models["roberta-mean"], refs=("v2",))
    hub_cache_snapshot(cache, HUB_TINY_RERANKER, tiny_models["bert-cross-encoder"])
    return cache


@pytest.fixture
def hub(hub_cache, monkeypatch) -> Path:
    """HF_HUB_CACHE pointed at hub_cache for one test, in this process (huggingface_hub reads the variable once, at
    import: its constant is patched) and in the subprocesses it starts."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    return hub_cache


@pytest.fixture(scope="session")
def cpu() -> dict[str, Any]:
    """Engine options for framework objects in tests: the CPU in float32, so results compare with references."""
    return {"device": "cpu", "dtype": "float32"}
