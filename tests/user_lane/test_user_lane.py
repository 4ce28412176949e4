"""The user lane: the README's commands and snippets as a user runs them, in subprocesses whose environment holds
nothing of the suite's (no VLLM_PLUGINS, no test paths, no HF_HUB_CACHE): PATH with the venv's bin first, a HOME
whose Hugging Face cache holds the models by their ids, and HF_HUB_OFFLINE=1 (this machine has no hub).

Two setups:
- the machine `make install` leaves: the RBLN SDK's Python packages (vllm-rbln's plugin among them), no
  rebel-compiler. vLLM's bare import would crash on vllm-rbln's platform here, so every entry point must choose
  the backend first.
- an NPU host: rebel-compiler importable (the stand-in, tests/standin) and one NPU device present
  (tests/npu_host/sitecustomize.py), so vllm-rbln's platform plugin would activate on a bare vLLM import and
  `device="auto"` picks the NPU. The stand-in has no librbln.so (rebel-compiler's runtime, which torch-rbln's
  autoload loads), so the .pth `make install` leaves turns that autoload off here as on a CPU machine, with no
  variable set (on a real NPU host, where torch-rbln's resolver finds the library, torch-rbln loads). Its models are
  tiny ones stored under the README's ids, so that compiling every bucket graph through the stand-in stays cheap.

One server start per setup serves every HTTP check of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import reference
from model_builders import HUB_MINILM, hub_cache_snapshot
from npu import STANDIN
from servers import GUARDED, PROBES, Server, outliving
from tolerances import BF16_BETWEEN_PATHS_MIN_COSINE

from rbln_retrieval import backend
from rbln_retrieval.backend.graph import ARCHITECTURES
from rbln_retrieval.engines.protocol import DESCRIBE_PATH
from rbln_retrieval.server.serve import ENGINE_DIED

pytestmark = pytest.mark.server

BIN = Path(sys.executable).parent
NPU_HOST = Path(__file__).resolve().parents[1] / "npu_host"
RERANKER = "BAAI/bge-reranker-base"
KEY = "user-lane-key-5c2a"
HEADERS = {"Authorization": f"Bearer {KEY}"}

# The README's LangChain and LlamaIndex blocks with the classes' defaults (no model named), in one program. It prints
# the best retrieved text (the embedding model's ranking) and how many results the reranker kept (the test's
# reranker has random weights: its order means nothing).
FRAMEWORKS = textwrap.dedent(
    """
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_rbln import RBLNEmbeddings, RBLNReranker

    store = InMemoryVectorStore.from_texts(
        ["An NPU is a neural processing unit.", "Paris is the capital of France."], RBLNEmbeddings()
    )
    hits = store.similarity_search("What is an NPU?", k=2)
    best = RBLNReranker(top_n=1).compress_documents(hits, "What is an NPU?")
    print("langchain", hits[0].page_content, "|", len(best))

    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.embeddings.rbln import RBLNEmbedding
    from llama_index.postprocessor.rbln_rerank import RBLNReranker as Reranker

    Settings.embed_model = RBLNEmbedding()
    index = VectorStoreIndex.from_documents(
        [Document(text="An NPU is a neural processing unit."), Document(text="Paris is the capital of France.")]
    )
    retrieved = index.as_retriever(similarity_top_k=2).retrieve("What is an NPU?")
    nodes = Reranker(top_n=1).postprocess_nodes(retrieved, query_str="What is an NPU?")
    print("llama_index", retrieved[0].node.get_content(), "|", len(nodes))
    """
)

# A plain process's vLLM general plugins, as vLLM loads them in each of its processes: the entry points named
# rbln_retrieval, which of the names in argv vLLM's registry then knows, whether a model module of the backend was
# imported for that, and the platform.
PLUGINS_PROBE = textwrap.dedent(
    """
    import sys
    from importlib.metadata import entry_points
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm import ModelRegistry
    from vllm.platforms import current_platform

    print([ep.value for ep in entry_points(group="vllm.general_plugins") if ep.name == "rbln_retrieval"])
    print([name for name in sys.argv[1:] if name in ModelRegistry.get_supported_archs()])
    print(any(name.startswith("rbln_retrieval.backend.graph.architectures.") for name in sys.modules))
    print(type(current_platform).__name__)
    """
)
GENERAL_PLUGIN = f"rbln_retrieval.backend:{backend.register_general.__name__}"
REINSTALL = (
    "the installed rbln-retrieval lacks its vllm.general_plugins entry point (pyproject.toml), so vLLM's server and "
    "engine processes cannot build the bundled architectures: reinstall the package (make install, or "
    "pip install --no-deps --no-build-isolation -e .) to refresh its metadata"
)


def user_env(home: Path, *, npu_host: bool) -> dict[str, str]:
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
    if npu_host:
        env |= {"PYTHONPATH": f"{STANDIN}:{NPU_HOST}", "REBEL_STANDIN_NPU": "RBLN-CA25"}
    return env


def run(command: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=env, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=1200)


def user_home(root: Path, models: dict[str, Path]) -> Path:
    """A HOME whose Hugging Face cache (~/.cache/huggingface/hub) holds ``models`` by id."""
    for repo_id, path in models.items():
        hub_cache_snapshot(root / ".cache" / "huggingface" / "hub", repo_id, path)
    return root


class Setup:
    def __init__(self, home: Path, npu_host: bool, log: Path):
        self.home, self.env, self.log = home, user_env(home, npu_host=npu_host), log
        self.server: Server | None = None

    def serve(self) -> Server:
        """The README's serve command, started now and ready (the key from RBLN_API_KEY)."""
        self.server = Server(HUB_MINILM, self.log, user_env={**self.env, "RBLN_API_KEY": KEY})
        self.server.wait_ready()
        return self.server

    def stop(self) -> int | None:
        return self.server.stop() if self.server is not None else None

    def cli(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return run(["rbln-retrieval", *args], self.env, self.home, stdin)


@pytest.fixture(scope="module")
def installed(tmp_path_factory, minilm, tiny_models) -> Iterator[Setup]:
    """The machine `make install` leaves, with the README's models in the user's Hugging Face cache, and the
    README's serve command running on it (the key from RBLN_API_KEY)."""
    root = tmp_path_factory.mktemp("user-installed")
    home = user_home(root / "home", {HUB_MINILM: minilm, RERANKER: tiny_models["bert-cross-encoder"]})
    setup = Setup(home, npu_host=False, log=root / "serve.log")
    try:
        setup.serve()
        yield setup
    finally:
        stopped = setup.stop()
    assert stopped == 0, f"serve exited with {stopped} on SIGTERM; a requested stop is 0"


def check_server(server: Server, dimension: int) -> np.ndarray:
    """Every guarded route refuses a caller without the key, the probes answer anyone, and with the key the
    README's calls (embeddings, rerank) are answered; a body past the size limit is 413; the engine's worker runs
    inside its engine-core process (vLLM's CPU platform would spawn a third process, a second import of torch and
    vLLM and its own memory). Returns the vector."""
    engine_processes = [p.name() for p in psutil.Process(server.process.pid).children(recursive=True)]
    assert engine_processes.count("VLLM::EngineCore") == 1 and not any("Worker" in n for n in engine_processes), (
        engine_processes
    )
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for path in PROBES:
            assert client.get(path).status_code == 200, path
        for method, path in GUARDED:
            assert client.request(method, path, json={}).status_code == 401, (method, path)
        answer = client.post("/v1/embeddings", json={"input": ["What is an NPU?"]}, headers=HEADERS)
        assert answer.status_code == 200, answer.text
        vector = np.asarray(answer.json()["data"][0]["embedding"])
        assert vector.shape == (dimension,) and abs(np.linalg.norm(vector) - 1) < 1e-3
        documents = ["Paris is the capital of France.", "An NPU is a neural processing unit."]
        ranked = client.post("/rerank", json={"query": "What is an NPU?", "documents": documents}, headers=HEADERS)
        assert ranked.status_code == 200, ranked.text
        assert sorted(r["index"] for r in ranked.json()["results"]) == [0, 1]
        description = client.get(DESCRIBE_PATH, headers=HEADERS).json()
        assert description["model"] == HUB_MINILM
        too_big = client.post("/v1/embeddings", json={"input": ["x" * 3_000_000]}, headers=HEADERS)
        assert too_big.status_code == 413, too_big.text
    return vector


def test_serve_as_the_readme_writes_it(installed):
    assert installed.server is not None
    vector = check_server(installed.server, 384)
    # The CLI's embed of the same text, by the same id, from the same user's cache: the same vector.
    embedded = installed.cli(
        "embed", "--model", HUB_MINILM, "--kind", "query", "--no-progress", stdin="What is an NPU?\n"
    )
    assert embedded.returncode == 0, embedded.stderr
    assert np.abs(np.asarray(json.loads(embedded.stdout)["embedding"]) - vector).max() < 1e-2


def test_doctor_and_compile_say_what_this_machine_is(installed):
    doctor = installed.cli("doctor")
    assert doctor.returncode == 0, doctor.stderr
    assert "vllm-rbln            0.12.0" in doctor.stdout and "rebel-compiler       not installed" in doctor.stdout
    assert "device auto          cpu" in doctor.stdout
    compiled = installed.cli("compile", HUB_MINILM, "--npu", "RBLN-CA25")
    assert compiled.returncode == 1
    assert compiled.stderr.startswith("rbln-retrieval: error: Compiling for an RBLN NPU needs rebel-compiler")
    assert len(compiled.stderr.strip().splitlines()) == 1, compiled.stderr


def test_framework_classes_with_their_defaults(installed):
    done = run([sys.executable, "-c", FRAMEWORKS], installed.env, installed.home)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "langchain An NPU is a neural processing unit. | 1" in done.stdout
    assert "llama_index An NPU is a neural processing unit. | 1" in done.stdout


def test_an_npu_host_runs_this_packages_backend_never_vllm_rbln(tmp_path, tiny_models):
    """On a simulated NPU host, where vllm-rbln's platform would win a bare vLLM import: doctor picks the NPU,
    compile builds the README's model's graphs ahead of time, serve runs it on the NPU route through this package's
    backend, loading those graphs (it compiles none), and both frameworks run on the NPU route. The CLI's own
    entry on this host is compile's (embed shares it; embed itself runs on the installed machine). A bare
    `import torch` works here with no variable set, and torch-rbln's autoload stays on where its resolver finds a
    librbln.so (one on LD_LIBRARY_PATH: an empty file here, so torch-rbln then fails to load it)."""
    home = user_home(
        tmp_path / "home", {HUB_MINILM: tiny_models["bert-cls"], RERANKER: tiny_models["bert-cross-encoder"]}
    )
    setup = Setup(home, npu_host=True, log=tmp_path / "serve.log")
    bare = run([sys.executable, "-c", "import torch; print(torch.__version__)"], setup.env, home)
    assert bare.returncode == 0, bare.stderr[-3000:]
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "librbln.so").touch()
    autoloaded = run([sys.executable, "-c", "import torch"], setup.env | {"LD_LIBRARY_PATH": str(runtime)}, home)
    assert autoloaded.returncode != 0 and f"Failed to load {runtime / 'librbln.so'}" in autoloaded.stderr, (
        autoloaded.stderr[-3000:]
    )
    try:
        doctor = setup.cli("doctor")
        assert doctor.returncode == 0, doctor.stderr
        assert "device auto          rbln" in doctor.stdout, doctor.stdout
        compiled = setup.cli("compile", HUB_MINILM, "--npu", "RBLN-CA25")
        assert compiled.returncode == 0 and compiled.stdout.startswith("compiled "), compiled.stderr[-3000:]
        artifacts = built_graphs(home)
        assert artifacts, "no artifacts in the user's compile cache"
        server = setup.serve()  # after compile: it loads the graphs compile built
        check_server(server, dimension=tiny_dimension(tiny_models["bert-cls"]))
        assert built_graphs(home) == artifacts, "serve compiled graphs again instead of loading compile's"
        frameworks = run([sys.executable, "-c", FRAMEWORKS], setup.env, home)
        assert frameworks.returncode == 0, frameworks.stderr[-3000:]
        assert frameworks.stdout.count(" | 1") == 2, frameworks.stdout
        # A supervisor (systemd's Restart=on-failure, Kubernetes) restarts a server only on a non-zero exit.
        (core,) = [
            p for p in psutil.Process(server.process.pid).children(recursive=True) if p.name() == "VLLM::EngineCore"
        ]
        core.kill()
        assert server.process.wait(timeout=300) == ENGINE_DIED
    finally:
        setup.stop()
    log = (tmp_path / "serve.log").read_text()
    assert "vllm_rbln" not in log and "RblnPlatform" not in log, log[-3000:]


def built_graphs(home: Path) -> dict[Path, int]:
    """The compiled graphs in the user's compile cache, each with the time it was written."""
    return {path: path.stat().st_mtime_ns for path in (home / ".cache" / "rbln-retrieval").rglob("*.rbln")}


def tiny_dimension(path: Path) -> int:
    return json.loads((path / "config.json").read_text())["hidden_size"]


@pytest.mark.parametrize("npu_host", [False, True], ids=["installed-scoped", "npu-host-unscoped"])
def test_vllm_loads_the_bundled_architectures_in_a_plain_process(tmp_path, npu_host):
    """vLLM's general plugins, as every vLLM process loads them (this needs the installed entry point): our engines
    name only this package's plugin in VLLM_PLUGINS, so vllm-rbln's stay out; a user's process without VLLM_PLUGINS
    loads every plugin (vLLM's default: on an NPU host vllm-rbln's platform and plugins, where rebel-compiler is
    missing vLLM's import fails on them), and the bundled architectures are registered beside vllm-rbln's. Either
    way by name only: no model module is imported until vLLM builds one."""
    env = user_env(tmp_path, npu_host=npu_host)
    if not npu_host:  # the README's variable where torch-rbln's native library is missing
        env |= {"VLLM_PLUGINS": backend.PLUGIN_NAME, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    done = run([sys.executable, "-c", PLUGINS_PROBE, *ARCHITECTURES], env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    plugin, registered, imported, platform = done.stdout.strip().splitlines()[-4:]
    assert plugin == repr([GENERAL_PLUGIN]), REINSTALL
    assert registered == repr(list(ARCHITECTURES)), done.stderr[-3000:]
    assert imported == "False"
    assert platform == ("RblnPlatform" if npu_host else "CpuPlatform")


def test_serve_builds_an_architecture_the_backend_adds(tmp_path, tiny_models):
    """`rbln-retrieval serve` of a SPLADE checkpoint as the README writes it (the installed package, in a scrubbed
    environment): vLLM's API server and engine core know RblnBertSpladeModel from the installed general plugin
    (without it the server stops at start: "Model architectures ['RblnBertSpladeModel'] are not supported"), and
    TEI's /embed_sparse answers the sparse vector (a dense route refuses a SPLADE model in one sentence); the serve
    process SIGKILLed alone, its engine core ends too."""
    from importlib.metadata import entry_points

    installed = [ep.value for ep in entry_points(group="vllm.general_plugins") if ep.name == backend.PLUGIN_NAME]
    assert installed == [GENERAL_PLUGIN], REINSTALL  # before a server start that would fail on it
    path, text = tiny_models["splade"], "the cat sat on the mat, the end"
    home = tmp_path / "home"
    home.mkdir()
    server = Server(path, tmp_path / "serve.log", user_env=user_env(home, npu_host=False))
    try:
        server.wait_ready()
        answer = httpx.post(server.url + "/embed_sparse", json={"inputs": [text]}, timeout=120)
        # The serve process alone is killed (as the kernel's OOM killer picks one process): its engine core, which
        # would hold its memory (on an NPU, its device) for good, ends with it.
        engine = psutil.Process(server.process.pid).children(recursive=True)
        assert "VLLM::EngineCore" in [p.name() for p in engine], engine
        server.process.kill()
        server.process.wait()
        assert not outliving(engine, timeout=120), "the engine core outlived the killed serve process"
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    (sparse,) = answer.json()
    row, expected = np.zeros((2, json.loads((path / "config.json").read_text(encoding="utf-8"))["vocab_size"]))
    for entry in sparse:
        row[entry["index"]] = entry["value"]
    for token, weight in reference.splade(str(path), [text], max_length=512)[0].items():
        expected[token] = weight
    # Serve's default dtype (bfloat16 where the CPU has it); the sparse numerics are tests/engine/test_splade.py's.
    assert row.min() >= 0 and (row > 0).sum() > 50
    assert row @ expected / (np.linalg.norm(row) * np.linalg.norm(expected)) >= BF16_BETWEEN_PATHS_MIN_COSINE
