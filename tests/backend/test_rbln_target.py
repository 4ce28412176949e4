"""The rbln target: without the runtime it fails with one sentence; with the runtime mocked at rbln_runtime's
boundary (rebel's modules and the device probe), it hands rebel's backend the graphs, cache and device."""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from rbln_retrieval import PoolingEngine, backend
from rbln_retrieval.backend import rbln_runtime
from rbln_retrieval.backend.compile import recording_backend
from rbln_retrieval.backend.config import BundledConfig
from rbln_retrieval.errors import DeviceUnavailableError
from rbln_retrieval.testing import minilm_path

NO_RUNTIME = "device='rbln' cannot be used: the RBLN runtime is not installed (rebel-compiler, torch-rbln missing)"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RBLN_RETRIEVAL_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_rbln_without_runtime_is_one_clear_sentence():
    assert not rbln_runtime.probe().installed, "this machine has no RBLN runtime"
    with pytest.raises(DeviceUnavailableError) as failure:
        PoolingEngine(minilm_path(), device="rbln")
    message = str(failure.value)
    assert message.startswith(NO_RUNTIME) and message.count(". ") == 0 and "\n" not in message
    # The engine-core side fails the same way if it is ever asked for the rbln target.
    with pytest.raises(DeviceUnavailableError, match="RBLN runtime is not installed"):
        recording_backend(BundledConfig(target="rbln", buckets=(16,)))


@pytest.fixture
def fake_rebel(monkeypatch):
    """rebel's torch.compile entry point and an NPU, faked at the module boundary rbln_runtime imports."""
    calls = []

    def rbln_backend(gm, example_inputs, **kwargs):
        calls.append({"inputs": [tuple(t.shape) for t in example_inputs], **kwargs})
        return gm.forward

    torch_compile = types.ModuleType("rebel.core.torch_compile")
    torch_compile.rbln_backend = rbln_backend
    modules = {"rebel": types.ModuleType("rebel"), "rebel.core": types.ModuleType("rebel.core"),
               "rebel.core.torch_compile": torch_compile}
    modules["rebel"].get_npu_name = lambda device_id=0: "RBLN-CA25"
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(rbln_runtime, "probe", lambda: rbln_runtime.RuntimeProbe(True, 1, "mocked NPU"))
    return calls


def test_rbln_target_compiles_with_rebels_backend_for_the_npu(fake_rebel, cache_dir):
    bundled = BundledConfig(target="rbln", buckets=(16,), cache_key={"model": "/models/minilm"})
    recorder = recording_backend(bundled)
    assert recorder.inner is sys.modules["rebel.core.torch_compile"].rbln_backend
    compiled = torch.compile(lambda x: (x * 2).sum(0), backend=recorder, dynamic=False)
    assert torch.equal(compiled(torch.ones(16, 4)), torch.full((4,), 32.0))
    (call,) = fake_rebel
    assert call["inputs"] == [(16, 4)]
    assert call["options"] == {
        "cache_dir": str(bundled.cache_dir() / "rbln"),
        "mode": "strict",
        "tensor_parallel_size": 1,
        "global_device_id": 0,
    }
    assert bundled.cache_dir().parent == cache_dir and bundled.cache_dir().is_dir()
    assert rbln_runtime.npu_name() == "RBLN-CA25"


@pytest.mark.parametrize("in_process", [True, False])
def test_device_rbln_starts_vllm_with_the_rbln_target(fake_rebel, monkeypatch, in_process):
    started = {}

    class FakeEngine:
        """Records what the engine is started with instead of starting one (as AsyncLLM or InprocEngine)."""

        @classmethod
        def from_engine_args(cls, args):
            started["env"] = os.environ.get(backend.ACTIVATE_ENV)
            started["multiprocessing"] = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
            started["args"] = args
            return cls()

        @classmethod
        async def start(cls, args):
            return cls.from_engine_args(args)

        def shutdown(self):
            started["shutdown"] = True

    if in_process:
        monkeypatch.setattr("rbln_retrieval.inproc.InprocEngine", FakeEngine)
    else:
        monkeypatch.setattr("vllm.v1.engine.async_llm.AsyncLLM", FakeEngine)
    with PoolingEngine(minilm_path(), device="rbln", in_process=in_process) as engine:
        assert engine.device == "rbln"
    assert started["env"] == "rbln" and os.environ.get(backend.ACTIVATE_ENV) is None
    assert started["multiprocessing"] == ("0" if in_process else None)
    args = started["args"]
    settings = args.additional_config["rbln_retrieval"]
    assert settings["target"] == "rbln" and settings["kernels"] == "static"
    assert args.worker_cls == "rbln_retrieval.backend.worker.BundledWorker"
    assert args.enable_chunked_prefill is False and args.enable_prefix_caching is False
    assert started["shutdown"]
