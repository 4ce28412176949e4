"""The rbln target end to end against the stand-in compiler (tests/standin), on both routes (ATOM's RBLN-CA25 through
compile_from_torch, Rebel100's RBLN-CR13 through torch.compile): the one-sentence failure without the runtime,
compile-only builds that an NPU host's start loads without compiling, builds for other NPUs, SDKs and snapshots
beside each other in one cache root (a model changed in place recompiles), the NPU chosen by RBLN_VISIBLE_DEVICES
(or Ray's legacy RBLN_DEVICES), both frameworks on device="rbln", and coexistence with another vendor's vLLM
platform plugin."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import reference
from model_builders import MAX_POSITIONS, minilm_path
from npu import NPUS, rbln_options, start_rbln

from rbln_retrieval import PoolingEngine, backend
from rbln_retrieval.backend.config import BundledConfig
from rbln_retrieval.backend.graph.compile import recording_backend
from rbln_retrieval.backend.npu import rbln_runtime
from rbln_retrieval.backend.npu.artifacts import ArtifactMismatchError
from rbln_retrieval.cli import main
from rbln_retrieval.errors import DeviceUnavailableError
from rbln_retrieval.frameworks.rendezvous import SHARE_ENV

# torch-rbln (an SDK 0.12 package from PyPI) is installed here; rebel-compiler is not.
NO_RUNTIME = "device='rbln' cannot be used: the RBLN runtime is not installed (rebel-compiler missing)"
QUERY = "How are exceptions raised and handled in Python?"
PASSAGES = [
    "The raise statement raises an exception; try and except handle it.",
    "Lists are mutable sequences, typically used to store collections of homogeneous items.",
    "A for loop iterates over the items of any sequence in the order they appear.",
    "Exceptions propagate up the call stack until an except clause handles them.",
]


def test_rbln_without_runtime_is_one_clear_sentence():
    assert not rbln_runtime.probe().installed, "this machine has no RBLN runtime"
    with pytest.raises(DeviceUnavailableError) as failure:
        PoolingEngine(minilm_path(), device="rbln")
    message = str(failure.value)
    assert message.startswith(NO_RUNTIME) and message.count(". ") == 0 and "\n" not in message
    # The engine-core side fails the same way if it is ever asked for the rbln target.
    with pytest.raises(DeviceUnavailableError, match="RBLN runtime is not installed"):
        recording_backend(BundledConfig(target="rbln", buckets=(16,), npu="RBLN-CA25", cache_key={"dtype": "float32"}))
    with pytest.raises(DeviceUnavailableError, match="needs rebel-compiler, which is not installed"):
        main_or_raise(["compile", str(minilm_path()), "--npu", "RBLN-CA25"])
    with pytest.raises(DeviceUnavailableError, match="needs rebel-compiler"):  # the deprecated flag still works
        main_or_raise(["compile", str(minilm_path()), "--soc", "RBLN-CA25"])


def main_or_raise(argv: list[str]) -> int:
    """The CLI's own error path prints; this re-raises what it caught, for an exact assertion."""
    from rbln_retrieval import cli

    _, commands = cli._parser()
    args = commands[argv[0]].parse_intermixed_args(argv[1:])
    return args.run(args)


@pytest.fixture(scope="module")
def shipped(request, standin_rebel, tiny_models, tmp_path_factory):
    """``rbln-retrieval compile MODEL --npu NPU`` on a build host (rebel-compiler, no NPU) for ``request.param``:
    (npu, model copy, cache root, printed line, graphs compiled). The model is a copy, so a test may alter it."""
    npu = request.param
    model = Path(shutil.copytree(tiny_models["bert-cls"], tmp_path_factory.mktemp("model") / "bert-cls"))
    root = tmp_path_factory.mktemp(f"shipped-{npu}")
    patch = pytest.MonkeyPatch()
    patch.setattr(rbln_runtime, "probe", lambda: rbln_runtime.RuntimeProbe(True, 0, "no NPU device"))
    patch.setenv("RBLN_RETRIEVAL_CACHE_DIR", str(root))
    patch.setenv("REBEL_STANDIN_NPU", "")  # nothing mounted
    for name in ("RBLN_FORCE_NPU_NAME", "RBLN_TARGET_SOC"):
        patch.delenv(name, raising=False)
    first = len(standin_rebel.COMPILED)
    try:
        with tempfile.TemporaryFile("w+") as out:  # a real file: vLLM's start needs stdout's descriptor
            with contextlib.redirect_stdout(out):
                assert main(["compile", str(model), "--npu", npu, "--dtype", "float32"]) == 0
            out.seek(0)
            printed = out.read()
    finally:
        patch.undo()
    return npu, model, root, printed, standin_rebel.COMPILED[first:]


@pytest.fixture
def npu_host(shipped, monkeypatch):
    """The host the artifacts are shipped to: the NPU of ``shipped`` mounted (two of them), the same cache root, a
    fresh process (the stand-in's in-memory compile cache empty)."""
    from rebel.core import mega_cache

    npu, _, root, _, _ = shipped
    monkeypatch.setattr(rbln_runtime, "probe", lambda: rbln_runtime.RuntimeProbe(True, 2, "the stand-in NPU"))
    monkeypatch.setenv("RBLN_RETRIEVAL_CACHE_DIR", str(root))
    monkeypatch.setenv("REBEL_STANDIN_NPU", npu)
    monkeypatch.setattr(mega_cache, "STORE", {})
    monkeypatch.delenv("RBLN_VISIBLE_DEVICES", raising=False)
    return shipped


ROUTES = {"RBLN-CA25": "aot", "RBLN-CR13": "torch.compile"}


@pytest.mark.parametrize("shipped", NPUS, indirect=True)
def test_compile_only_builds_what_an_npu_host_loads_without_compiling(npu_host, standin_rebel, monkeypatch):
    npu, model, _, printed, built = npu_host
    assert printed.startswith("compiled ") and f"for {npu} ({ROUTES[npu]}) into " in printed
    assert built and all(g.route == ROUTES[npu] and not g.cached and not g.violations for g in built)
    if ROUTES[npu] == "torch.compile":
        assert all(g.options["mode"] == ["strict", "compile_only"] for g in built)
    cache_dir = printed.rsplit(" into ", 1)[1].strip()
    manifest = json.loads(Path(cache_dir, "graphs.json").read_text())
    assert len(manifest["graphs"]) == len(manifest["buckets"]) == len(built)
    assert manifest["pins"]["npu"] == npu and manifest["pins"]["sdk"] == standin_rebel_version()

    # The NPU host: Ray's RBLN resource sets the legacy RBLN_DEVICES, read as RBLN_VISIBLE_DEVICES with a warning.
    from rebel import aot

    monkeypatch.setenv("RBLN_DEVICES", "1")
    monkeypatch.setattr(rbln_runtime, "_warned", set())
    served, runtimes = len(standin_rebel.COMPILED), len(aot.RUNTIMES)
    with pytest.warns(DeprecationWarning, match="RBLN_DEVICES is deprecated"):
        engine = PoolingEngine(model, device="rbln", dtype="float32")
    with engine:
        stats = engine.stats()
        assert engine.embed(["hello"]).shape == (1, engine.dimension)
    assert stats["compile_cache"]["dir"] == cache_dir and stats["compile_cache"]["reused"]
    assert (stats["npu"], stats["route"], stats["compile_only"]) == (npu, ROUTES[npu], False)
    assert stats["rbln_devices"] == ["1"] and "RBLN_DEVICES" not in os.environ
    again = standin_rebel.COMPILED[served:]
    if ROUTES[npu] == "aot":
        buckets = len(stats["buckets"])
        assert stats["compile_cache"] | {"dir": None} == {
            "dir": None,
            "reused": True,
            "artifacts_loaded": buckets,
            "artifacts_compiled": 0,
        }
        assert again == [], "nothing compiled: every bucket's .rbln was loaded"
        assert [(r["device"], r["visible"], r["legacy"]) for r in aot.RUNTIMES[runtimes:]] == [(0, "1", None)] * buckets
    else:
        assert again and all(g.cached for g in again), "every graph came from the shipped bundle"
        assert {(g.rbln_devices, g.legacy_devices) for g in again} == {("1", None)}


@pytest.mark.parametrize("shipped", ["RBLN-CA25"], indirect=True)
def test_builds_for_other_npus_coexist_and_weights_changed_in_place_recompile(npu_host, standin_rebel, monkeypatch):
    """One cache root shared by an ATOM and a Rebel100 host, then the model fine-tuned and saved over the same
    directory (same file names, same sizes): every start serves vectors of the weights on disk."""
    import reference

    npu, model, _, printed, _ = npu_host
    shipped_dir = printed.rsplit(" into ", 1)[1].strip()

    def start(mounted: str) -> tuple[np.ndarray, dict]:
        monkeypatch.setenv("REBEL_STANDIN_NPU", mounted)
        with PoolingEngine(model, device="rbln", dtype="float32") as engine:
            stats = engine.stats()
            return engine.embed(PASSAGES), {**stats["compile_cache"], "buckets": len(stats["buckets"])}

    _, rebel100 = start("RBLN-CR13")  # a Rebel100 host after the ATOM build: its own directory beside it
    assert rebel100["dir"] != shipped_dir and not rebel100["reused"]
    before, atom = start(npu)  # the ATOM build is still there, untouched
    assert atom["dir"] == shipped_dir and atom["reused"]
    assert (atom["artifacts_loaded"], atom["artifacts_compiled"]) == (atom["buckets"], 0)

    weights = model / "model.safetensors"
    size = weights.stat().st_size
    overwrite_every_weight(weights)
    assert weights.stat().st_size == size
    after, tuned = start(npu)
    assert tuned["dir"] != shipped_dir and (tuned["artifacts_loaded"], tuned["artifacts_compiled"]) == (
        0,
        tuned["buckets"],
    )
    wanted = reference.embed(str(model), PASSAGES, pooling="CLS", max_length=512)
    stale, fresh = (float(np.mean(np.sum(v * wanted, axis=1))) for v in (before, after))
    print(f"mean cosine to the new weights' vectors: {stale:.4f} before the change, {fresh:.6f} after")
    assert fresh > 0.999 and stale < 0.5

    # A directory whose manifest pins another SDK than its key (copied or renamed by hand) is refused, not served.
    manifest = Path(tuned["dir"], "graphs.json")
    pinned = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**pinned, "pins": {**pinned["pins"], "sdk": "0.11.0"}}))
    with pytest.raises(ArtifactMismatchError) as failure:
        PoolingEngine(model, device="rbln", dtype="float32")
    message = str(failure.value)
    assert message.startswith(f"The RBLN artifacts in {tuned['dir']} were built for rebel-compiler 0.11.0 but ")
    assert message.count(". ") == 0 and "\n" not in message and "--npu RBLN-CA25" in message


def overwrite_every_weight(path: Path) -> None:
    """Every tensor of a safetensors file replaced by other values of the same name, dtype and shape, saved over
    it: the file keeps its name and size, as a fine-tune saved into the same directory does."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), "pt") as source:
        metadata = source.metadata()
        tensors = {name: source.get_tensor(name) for name in source.keys()}  # noqa: SIM118 (safe_open is not iterable)
    generator = torch.Generator().manual_seed(45)
    changed = {
        name: (torch.randn(t.shape, generator=generator) * (float(t.float().std()) + 0.05)).to(t.dtype)
        if t.is_floating_point()
        else t
        for name, t in tensors.items()
    }
    save_file(changed, str(path), metadata=metadata)


def test_snapshot_hashes_the_content_once_and_again_after_a_change_in_place(tmp_path, monkeypatch):
    import hashlib

    from rbln_retrieval.backend.npu.artifacts import snapshot_fingerprint

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 4096)
    hashes = tmp_path / "cache" / "content-hashes.json"
    reads: list[str] = []
    real = hashlib.file_digest
    monkeypatch.setattr(hashlib, "file_digest", lambda f, d: reads.append(f.name) or real(f, d))
    first = snapshot_fingerprint(model, hashes)
    assert len(reads) == 2 and hashes.is_file()
    assert snapshot_fingerprint(model, hashes) == first and len(reads) == 2, "unchanged files are not read again"
    (model / "model.safetensors").write_bytes(b"b" * 4096)  # same name, same size
    assert snapshot_fingerprint(model, hashes) != first
    assert reads[2:] == [str(model / "model.safetensors")]
    # Builds for other NPUs, SDKs and snapshots key other directories of one cache root.
    base = BundledConfig(target="rbln", buckets=(64,), npu="RBLN-CA25", sdk="0.12.0", snapshot=first)
    others = [{"npu": "RBLN-CR13"}, {"sdk": "0.12.1"}, {"snapshot": snapshot_fingerprint(model, hashes)}]
    dirs = {base.cache_dir(), *(dataclasses.replace(base, **o).cache_dir() for o in others)}
    assert len(dirs) == 4


def standin_rebel_version() -> str:
    import rebel

    return rebel.__version__


def test_compile_only_needs_the_rbln_device_and_an_npu(standin_rebel, monkeypatch):
    for name in ("RBLN_FORCE_NPU_NAME", "RBLN_TARGET_SOC"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="Name the NPU to compile for with --npu"):
        main_or_raise(["compile", str(minilm_path())])
    settings = {"additional_config": {"rbln_retrieval": {"compile_only": True}}}
    with pytest.raises(ValueError, match="compile_only compiles for an RBLN NPU; it needs device='rbln'"):
        PoolingEngine(minilm_path(), device="cpu", engine_kwargs=settings)


def test_device_rbln_starts_vllm_with_the_static_graph_settings(standin_rebel, monkeypatch):
    started = {}

    class FakeEngine:
        """Records what the engine is started with instead of starting one."""

        @classmethod
        async def start(cls, args):
            started["env"] = {name: os.environ.get(name) for name in (backend.ACTIVATE_ENV, "VLLM_PLUGINS")}
            started["args"] = args
            return cls()

        def shutdown(self):
            started["shutdown"] = True

    monkeypatch.setattr("rbln_retrieval.local.inproc.InprocEngine", FakeEngine)
    with PoolingEngine(minilm_path(), device="rbln") as engine:
        assert engine.device == "rbln"
    assert started["env"] == {backend.ACTIVATE_ENV: "rbln", "VLLM_PLUGINS": backend.PLUGIN_NAME}
    assert os.environ.get(backend.ACTIVATE_ENV) is None
    args = started["args"]
    settings = args.additional_config["rbln_retrieval"]
    assert (settings["target"], settings["kernels"], settings["npu"]) == ("rbln", "static", "RBLN-CA25")
    assert args.compilation_config.custom_ops == ["none"], "vLLM's custom ops run their torch-native forward"
    assert args.worker_cls == "rbln_retrieval.backend.engine_core.worker.BundledWorker"
    assert args.enable_chunked_prefill is False and args.enable_prefix_caching is False
    assert started["shutdown"]


@pytest.fixture(scope="module")
def npu_minilm(npu, standin_rebel):
    engine = start_rbln(minilm_path(), npu)
    yield engine
    engine.close()


# The framework classes never see the target (tests/frameworks/test_framework_objects.py and the integrations' tests
# run them on the host): one end-to-end framework test per NPU route proves they reach it, LangChain on the
# ahead-of-time route, LlamaIndex on the torch.compile route.
@pytest.mark.parametrize("npu", ["RBLN-CA25"], indirect=True)
def test_langchain_vector_store_on_the_rbln_target(npu, npu_minilm, minilm_engine, monkeypatch):
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_rbln import RBLNEmbeddings

    monkeypatch.setenv(SHARE_ENV, "0")  # in this process: its simulated NPU exists only here
    embeddings = RBLNEmbeddings(model=str(minilm_path()), **rbln_options(npu))
    assert embeddings.engine.engine is npu_minilm.engine, "equal settings share the rbln engine"
    store = InMemoryVectorStore.from_texts(PASSAGES, embeddings)
    found = store.similarity_search_with_score(QUERY, k=2)
    assert {doc.page_content for doc, _ in found} == {PASSAGES[0], PASSAGES[3]}
    expected = minilm_engine.score(QUERY, PASSAGES)
    assert [score for _, score in found] == pytest.approx(sorted(expected, reverse=True)[:2], abs=1e-5)
    stats = npu_minilm.stats()
    assert (stats["npu"], stats["compiles_after_warmup"]) == (npu, 0)


@pytest.fixture(scope="module")
def reference_cross_encoder_scores(tiny_models):
    """Plain transformers' scores of the tiny cross-encoder (the passages are shorter than its max length)."""
    path = str(tiny_models["bert-cross-encoder"])
    return reference.cross_encoder_scores(path, QUERY, PASSAGES, max_length=MAX_POSITIONS)


@pytest.mark.parametrize("npu", ["RBLN-CR13"], indirect=True)
def test_llama_index_reranker_on_the_rbln_target(
    npu, standin_rebel, tiny_models, reference_cross_encoder_scores, monkeypatch
):
    from llama_index.core.schema import NodeWithScore, TextNode

    from llama_index.postprocessor.rbln_rerank import RBLNReranker

    path = tiny_models["bert-cross-encoder"]
    nodes = [NodeWithScore(node=TextNode(text=text), score=0.0) for text in PASSAGES]
    engine = start_rbln(path, npu)  # the shared engine the reranker runs on
    monkeypatch.setenv(SHARE_ENV, "0")  # in this process: its simulated NPU exists only here
    reranker = RBLNReranker(model=str(path), top_n=3, **rbln_options(npu))
    try:
        ranked = reranker.postprocess_nodes(nodes, query_str=QUERY)
        expected = sorted(reference_cross_encoder_scores, reverse=True)[:3]
        assert [n.score for n in ranked] == pytest.approx(expected, abs=1e-5)
        stats = engine.stats()
        assert (stats["target"], stats["npu"], stats["route"]) == ("rbln", npu, ROUTES[npu])
        assert stats["steps"] > 0 and stats["compiles_after_warmup"] == 0
    finally:
        reranker.close()
        engine.close()


def test_engines_start_beside_the_rbln_sdks_own_platform_plugin():
    """vLLM refuses to start when two out-of-tree platform plugins activate; vllm-rbln's (installed here, as on an NPU
    host) activates on every bare vLLM import. Our engines load only our own, in a process that sets no
    VLLM_PLUGINS."""
    assert any(ep.value == "vllm_rbln:register" for ep in entry_points(group="vllm.platform_plugins"))
    env = {name: value for name, value in os.environ.items() if name != "VLLM_PLUGINS"}
    resolve = "from vllm.platforms import current_platform; current_platform.device_type"
    clash = subprocess.run(
        [sys.executable, "-c", resolve],
        env={**env, backend.ACTIVATE_ENV: "host"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Only one platform plugin can be activated" in clash.stderr, "without scoping, vLLM refuses both"
    script = textwrap.dedent(f"""
        from rbln_retrieval import PoolingEngine
        with PoolingEngine({str(minilm_path())!r}, device="cpu", dtype="float32") as engine:
            print(engine.embed(["hello"]).shape, engine.stats()["runner"])
    """)
    started = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stderr[-2000:]
    assert "(1, 384) bundled" in started.stdout


def test_many_small_calls_keep_padding_low(minilm_engine):
    """Synchronous calls of 1 to 60 texts of mixed lengths (queries and passages) on the default buckets: the
    packing scheduler splits a step's tail into smaller buckets where that saves padding."""
    from corpus import passages

    rng = np.random.default_rng(3)
    words = " ".join(passages()).split()
    before = minilm_engine.stats()
    for _ in range(24):
        texts = []
        for _ in range(int(rng.integers(1, 61))):
            size = int(rng.choice([rng.integers(3, 16), rng.integers(20, 200)]))
            start = int(rng.integers(0, len(words) - size))
            texts.append(" ".join(words[start : start + size]))
        minilm_engine.embed(texts)
    after = minilm_engine.stats()
    useful = after["useful_tokens"] - before["useful_tokens"]
    computed = after["computed_tokens"] - before["computed_tokens"]
    assert len(after["buckets"]) <= 16
    assert useful / computed >= 0.90, f"useful/computed {useful / computed:.3f}"


def test_doctor_prints_each_bucket_graph(standin_rebel, tiny_models, capsys):
    path = tiny_models["qwen3-embedding"]
    assert main(["doctor", "--graphs", str(path), "--device", "rbln"]) == 0
    printed = capsys.readouterr().out
    assert f"graphs of {path} on rbln (rbln target, static kernels):" in printed
    assert "\n  attention: masked attention in the graph\n" in printed
    buckets = [line for line in printed.splitlines() if line.startswith("  bucket ")]
    assert len(buckets) >= 3 and all("0 weights as inputs, host kernels: none" in line for line in buckets)
    # Per shape: rows x width, FLOPs with attention's share, the largest activation.
    assert all(
        re.match(r"  bucket \d+x\d+: \d+\.\d GFLOP \(\d+% attention\), largest activation \d+\.\d MiB", line)
        for line in buckets
    ), buckets
    assert "torch.matmul" in printed and "torch.softmax" in printed
