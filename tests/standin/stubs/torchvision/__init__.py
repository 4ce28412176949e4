"""Test-only import stub, never shipped and never a working torchvision.

vLLM-rbln 0.12's optimum worker imports every optimum model module, and one of them reaches transformers' Qwen2-VL
image processor, which imports ``torchvision.transforms.v2.functional`` at module level (and transformers, seeing a
torchvision, imports ``torchvision.io`` and others in its image utilities). The SDK's ``+cpu`` torchvision cannot
be had here and PyPI's breaks vLLM, so the tests that start vllm-rbln's engine (text encoders only, no images) put
this folder on their subprocess's PYTHONPATH. Every ``torchvision.*`` module imports; any name taken from one is an
object that raises when called, so nothing can silently compute with it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+stub"


class Unavailable:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.name} is a test-only import stub (tests/standin/stubs), not torchvision")

    def __getattr__(self, attribute: str) -> Unavailable:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return Unavailable(f"{self.name}.{attribute}")


def _stub_getattr(module: str):
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unavailable(f"{module}.{name}")

    return __getattr__


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``torchvision.<sub>`` is a stub module."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(f"{__name__}."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__getattr__ = _stub_getattr(spec.name)  # type: ignore[method-assign]
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


sys.meta_path.insert(0, _Submodules())
__getattr__ = _stub_getattr(__name__)
