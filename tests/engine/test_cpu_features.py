"""The CPU class: dtype "auto", the emulated-bf16 warning, and ATen's capability cap that emulates the AVX2 class."""

from __future__ import annotations

import logging

import pytest

from rbln_retrieval import cpu_features
from rbln_retrieval.local.engine_args import THREAD_VARS, executor_backend, resolve_dtype

AVX512_BF16 = {"avx2", "fma", "avx512f", "avx512_bf16"}
AVX2_ONLY = {"avx2", "fma"}


@pytest.fixture
def cpu(monkeypatch):
    """Pretend the hardware has the given flags (and no ATen capability cap unless a test sets one)."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    cpu_features.warn_emulated_bf16.cache_clear()

    def having(found: set[str]) -> None:
        monkeypatch.setattr(cpu_features, "hardware_flags", lambda: set(found))

    return having


def test_auto_dtype_follows_the_cpu_class(cpu, monkeypatch):
    cpu(AVX512_BF16)
    assert resolve_dtype("auto", "cpu") == "bfloat16" and cpu_features.avx512()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the AVX2 class, emulated on an AVX-512 machine
    assert resolve_dtype("auto", "cpu") == "float32" and not cpu_features.avx512()
    assert "avx2" in cpu_features.flags() and "avx512_bf16" not in cpu_features.flags()
    cpu(AVX2_ONLY)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("auto", "rbln") == "auto", "the NPU's dtype is not the host CPU's business"


def test_explicit_bf16_on_an_emulating_cpu_runs_and_warns_once(cpu, caplog):
    cpu(AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="rbln_retrieval.cpu_features"):
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    (record,) = caplog.records
    assert "emulated" in record.getMessage() and "float32" in record.getMessage()
    caplog.clear()
    cpu(AVX512_BF16)
    cpu_features.warn_emulated_bf16.cache_clear()
    with caplog.at_level(logging.WARNING, logger="rbln_retrieval.cpu_features"):
        assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    assert not caplog.records, "native bf16 needs no warning"


def test_the_class_reports_name_amx_apart_from_avx512_bf16(cpu, monkeypatch):
    """Reports and the bench's result files name the class (bench/ingest_profile.py); AMX also picks the host
    layers' fused GEMM epilogues, so an AMX Xeon must not read "AVX512_BF16"."""
    cpu(AVX512_BF16 | {"amx_bf16", "amx_tile"})
    assert cpu_features.cpu_class() == "AMX" and cpu_features.amx()
    cpu(AVX512_BF16)
    assert cpu_features.cpu_class() == "AVX512_BF16" and not cpu_features.amx()
    cpu({"avx2", "avx512f"})
    assert cpu_features.cpu_class() == "AVX-512"
    cpu(AVX512_BF16 | {"amx_bf16"})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert cpu_features.cpu_class() == "AVX2" and not cpu_features.amx()


def test_an_engine_process_computes_in_its_engine_core_unless_vllms_thread_binding_is_set(monkeypatch):
    """Without vLLM's binding variables the worker runs inside the engine-core process (user_lane's check_server
    sees the process tree of a running server); with them, vLLM's worker process applies them."""
    for name in THREAD_VARS:
        monkeypatch.delenv(name, raising=False)
    assert executor_backend() == "uni"
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert executor_backend() == "mp"
