"""The rbln target end to end against the stand-in compiler (tests/standin): the one-sentence failure without the
runtime, compile-only builds that an NPU host's start reuses, the NPU chosen by RBLN_DEVICES, both frameworks on
device="rbln", and coexistence with another vendor's vLLM platform plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
from model_builders import minilm_path
from npu import rbln_options

from rbln_retrieval import PoolingEngine, backend, get_engine
from rbln_retrieval.backend import rbln_runtime
from rbln_retrieval.backend.compile import recording_backend
from rbln_retrieval.backend.config import BundledConfig
from rbln_retrieval.cli import main
from rbln_retrieval.errors import DeviceUnavailableError

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
        recording_backend(BundledConfig(target="rbln", buckets=(16,)))
    with pytest.raises(DeviceUnavailableError, match="needs rebel-compiler, which is not installed"):
        main_or_raise(["compile", str(minilm_path()), "--soc", "RBLN-CA25"])


def main_or_raise(argv: list[str]) -> int:
    """The CLI's own error path prints; this re-raises what it caught, for an exact assertion."""
    from rbln_retrieval import cli

    _, commands = cli._parser()
    args = commands[argv[0]].parse_intermixed_args(argv[1:])
    return args.run(args)


@pytest.fixture
def no_npu(standin_rebel, monkeypatch):
    """rebel-compiler installed (the stand-in) but no NPU in this host: a compile-only build host."""
    monkeypatch.setattr(rbln_runtime, "probe", lambda: rbln_runtime.RuntimeProbe(True, 0, "no NPU device"))
    return standin_rebel


def test_compile_only_fills_the_cache_an_npu_host_reuses(no_npu, tiny_models, monkeypatch, capsys):
    path = tiny_models["bert-cls"]
    first = len(no_npu.COMPILED)
    monkeypatch.delenv("RBLN_TARGET_SOC", raising=False)
    assert main(["compile", str(path), "--soc", "RBLN-CA25", "--dtype", "float32"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("compiled ") and "for RBLN-CA25 into " in printed
    built = no_npu.COMPILED[first:]
    assert built and all(g.options["mode"] == ["strict", "compile_only"] and not g.violations for g in built)
    cache_dir = printed.rsplit(" into ", 1)[1].strip()
    manifest = json.loads(Path(cache_dir, "graphs.json").read_text())
    assert len(manifest["graphs"]) == len(manifest["buckets"]) == len(built)
    assert all(g["ops"] for g in manifest["graphs"])

    # The NPU host: same model and options, an NPU present, RBLN_DEVICES naming the one to use.
    monkeypatch.setattr(rbln_runtime, "probe", lambda: rbln_runtime.RuntimeProbe(True, 2, "the stand-in NPU"))
    monkeypatch.setenv("RBLN_DEVICES", "1")
    monkeypatch.delenv("RBLN_TARGET_SOC")
    served = len(no_npu.COMPILED)
    with PoolingEngine(path, device="rbln", dtype="float32") as engine:
        stats = engine.stats()
        assert engine.embed(["hello"]).shape == (1, engine.dimension)
    assert stats["compile_cache"] == {"dir": cache_dir, "reused": True}
    assert stats["soc"] == "RBLN-CA25" and not stats["compile_only"] and stats["rbln_devices"] == ["1"]
    assert {g.rbln_devices for g in no_npu.COMPILED[served:]} == {"1"}, "rebel sees the NPU RBLN_DEVICES names"


def test_compile_only_needs_the_rbln_device_and_a_soc(no_npu, monkeypatch):
    monkeypatch.delenv("RBLN_TARGET_SOC", raising=False)
    with pytest.raises(ValueError, match="Name the NPU to compile for with --soc"):
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
    assert (
        settings["target"] == "rbln" and settings["kernels"] == "static" and settings["cache_key"]["soc"] == "RBLN-CA25"
    )
    assert args.compilation_config.custom_ops == ["none"], "vLLM's custom ops run their torch-native forward"
    assert args.worker_cls == "rbln_retrieval.backend.worker.BundledWorker"
    assert args.enable_chunked_prefill is False and args.enable_prefix_caching is False
    assert started["shutdown"]


@pytest.fixture(scope="module")
def npu_minilm(standin_rebel):
    engine = PoolingEngine.shared(minilm_path(), **rbln_options())
    yield engine
    engine.close()


def test_langchain_vector_store_on_the_rbln_target(npu_minilm, minilm_engine):
    from langchain_core.vectorstores import InMemoryVectorStore

    from langchain_rbln import RBLNEmbeddings

    embeddings = RBLNEmbeddings(model=str(minilm_path()), **rbln_options())
    assert embeddings.engine.engine is npu_minilm.engine, "equal settings share the rbln engine"
    store = InMemoryVectorStore.from_texts(PASSAGES, embeddings)
    found = store.similarity_search_with_score(QUERY, k=2)
    assert {doc.page_content for doc, _ in found} == {PASSAGES[0], PASSAGES[3]}
    expected = minilm_engine.score(QUERY, PASSAGES)
    assert [score for _, score in found] == pytest.approx(sorted(expected, reverse=True)[:2], abs=1e-5)
    assert npu_minilm.stats()["compiles_after_warmup"] == 0


def test_llama_index_reranker_on_the_rbln_target(standin_rebel, tiny_models):
    from llama_index.core.schema import NodeWithScore, TextNode

    from llama_index.postprocessor.rbln_rerank import RBLNReranker

    path = tiny_models["bert-cross-encoder"]
    nodes = [NodeWithScore(node=TextNode(text=text), score=0.0) for text in PASSAGES]
    with PoolingEngine(path, device="cpu", dtype="float32", runner="stock") as stock:
        expected = stock.score(QUERY, PASSAGES)
    reranker = RBLNReranker(model=str(path), top_n=3, **rbln_options())
    engine = get_engine(str(path), **rbln_options())  # a claim on the shared engine the reranker runs on
    try:
        ranked = reranker.postprocess_nodes(nodes, query_str=QUERY)
        assert [n.score for n in ranked] == pytest.approx(sorted(expected, reverse=True)[:3], abs=1e-5)
        stats = engine.stats()
        assert stats["target"] == "rbln" and stats["steps"] > 0 and stats["compiles_after_warmup"] == 0
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
    buckets = [line for line in printed.splitlines() if line.startswith("  bucket ")]
    assert len(buckets) >= 3 and all("0 weights as inputs, host kernels: none" in line for line in buckets)
    assert "torch.matmul" in printed and "torch.softmax" in printed
