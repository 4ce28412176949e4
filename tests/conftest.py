"""The shared all-MiniLM-L6-v2 engines and server of the core tests (an engine start costs 10-25 s, a server start
more: tests/engine_budget.py counts both)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tolerances import BF16_OPTIONS

from rbln_retrieval import PoolingEngine


@pytest.fixture(scope="session")
def minilm_engine(minilm) -> PoolingEngine:
    return PoolingEngine.shared(minilm, device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def minilm_bf16_engine(minilm) -> PoolingEngine:
    """all-MiniLM-L6-v2 in bfloat16 (explicitly, on every CPU class) for the tests of the bfloat16 path."""
    return PoolingEngine.shared(minilm, **BF16_OPTIONS)


@pytest.fixture(scope="session")
def tiny_engine(tiny_models) -> PoolingEngine:
    """A tiny random-weight BERT (CLS pooling) for tests of what the engine does with its input (order, chunking,
    memory, identity), which MiniLM's compute would only slow down; MiniLM's vectors are other tests' job."""
    return PoolingEngine.shared(tiny_models["bert-cls"], device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def minilm_server(minilm, tmp_path_factory):
    """`rbln-retrieval serve` of all-MiniLM-L6-v2 (float32, no API key, the default limits) for every test that
    only talks to a plain server; tests that need other options, or stop or kill it, start their own."""
    from servers import Server

    server = Server(minilm, tmp_path_factory.mktemp("minilm-server") / "minilm.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def reranker_server(tiny_models, tmp_path_factory):
    """`rbln-retrieval serve` of the tiny BERT cross-encoder (float32, no API key) for the HTTP lanes' rerank,
    score and classification routes (tests/server/test_http_clients.py, tests/server/test_http_fuzz.py)."""
    from servers import Server

    server = Server(tiny_models["bert-cross-encoder"], tmp_path_factory.mktemp("reranker-server") / "reranker.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster with 2 CPUs and 2 declared RBLN NPUs (none exist: engines fall back to the CPU), for
    one test module. Actor log lines reach the driver undeduplicated, so tests can read each actor's line."""
    import ray
    import ray._private.ray_logging

    # Ray merges log lines that differ only in numbers (RAY_DEDUP_LOGS, read once at import).
    ray._private.ray_logging.RAY_DEDUP_LOGS = False
    ray.init(num_cpus=2, resources={"RBLN": 2}, include_dashboard=False, log_to_driver=True)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def inner_pytest(pytester, monkeypatch) -> Callable[..., pytest.RunResult]:
    """``run(*args)``: a pytest session of the tests' helpers' plugins in a subprocess, for the tests of those plugins.
    It loads only the plugins it names (xdist, and those in ``args``): a bare session autoloads every plugin installed
    here (langsmith's, hypothesis', schemathesis', ...), seconds of imports per session and per xdist worker."""
    tests = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", f"{tests}:{tests.parent}")  # the helpers, and this checkout
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")

    def run(*args: str) -> pytest.RunResult:
        return pytester.runpytest_subprocess("-p", "xdist.plugin", "-p", "no:cacheprovider", *args)

    return run
