"""Engines for the backend tests: each model gets a bundled (strict_shapes) and a stock engine, started once per
model and closed after its tests; steps of at most 1024 tokens keep warmup to nine buckets. The rbln target runs
against the stand-in compiler in tests/standin (three buckets: each graph is lowered to ATen and checked)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from model_builders import minilm_path, remote_code_options
from npu import STANDIN, start_rbln

from rbln_retrieval import PoolingEngine
from rbln_retrieval.backend.npu import rbln_runtime

SETTINGS = {"max_num_batched_tokens": 1024}


@pytest.fixture(scope="module")
def standin_rebel() -> Iterator[ModuleType]:
    """The stand-in rebel-compiler importable, and an NPU reported present (device nodes are hardware), for the
    module's tests; yields the stand-in backend module, whose COMPILED lists every graph it was handed."""
    patch = pytest.MonkeyPatch()
    patch.syspath_prepend(str(STANDIN))
    patch.setattr(rbln_runtime, "probe", lambda: rbln_runtime.RuntimeProbe(True, 1, "the stand-in NPU"))
    import rebel.core.torch_compile as backend

    try:
        yield backend
    finally:
        patch.undo()
        for name in [m for m in sys.modules if m == "rebel" or m.startswith("rebel.")]:
            del sys.modules[name]


# The stock engines here are the reference vLLM computes: run eagerly, in the bundled engines' step size. Inductor's
# compile of each family's model (most of a stock start) is vLLM's own code path, and the stock runner as users
# start it (compiled) is run by tests/engine/test_bge_m3.py, tests/engine/test_splade.py and
# tests/backend/test_bfloat16.py.
STOCK = {"enforce_eager": True, "max_num_batched_tokens": SETTINGS["max_num_batched_tokens"]}


def start(path: Path, runner: str, **settings) -> PoolingEngine:
    extra = {"additional_config": {"rbln_retrieval": {**SETTINGS, **settings}}} if runner == "bundled" else STOCK
    return PoolingEngine(
        path,
        device="cpu",
        dtype="float32",
        runner=runner,
        strict_shapes=runner == "bundled",
        engine_kwargs=extra,
        **remote_code_options(path),
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
def npu(request) -> str:
    """The NPU name a module's rbln-target engine builds for (``request.param``, one of npu.NPUS)."""
    return request.param


def _rbln(path: Path, npu: str, standin: ModuleType) -> Iterator[tuple[PoolingEngine, list]]:
    first = len(standin.COMPILED)
    engine = start_rbln(path, npu, **remote_code_options(path))
    try:
        yield engine, standin.COMPILED[first:]
    finally:
        engine.close()


# One fixture per NPU family, keyed by ``pair`` alone: a module-scoped NPU parameter would make pytest set ``pair``
# up more than once (and its second bundled engine find the first one's compile cache).
@pytest.fixture(scope="module")
def rbln_atom(pair, standin_rebel) -> Iterator[tuple[PoolingEngine, list]]:
    """(rbln-target engine for RBLN-CA25, what the stand-in compiler recorded for it) for the model of ``pair``."""
    yield from _rbln(pair[0], "RBLN-CA25", standin_rebel)


@pytest.fixture(scope="module")
def rbln_rebel100(pair, standin_rebel) -> Iterator[tuple[PoolingEngine, list]]:
    """(rbln-target engine for RBLN-CR13, what the stand-in compiler recorded for it) for the model of ``pair``."""
    yield from _rbln(pair[0], "RBLN-CR13", standin_rebel)


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
