"""On a process's PYTHONPATH (a Ray actor's runtime_env): the process dies, as the kernel's OOM killer would end it,
the moment it constructs a PoolingEngine; for tests of actors that die in their constructor. The engine-start
counter's own sitecustomize (tests/engine_count), later on the path, is loaded first."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

TARGET = "rbln_retrieval.local.engine"


class _CrashOnEngine(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            module.PoolingEngine.__init__ = lambda *args, **kwargs: os._exit(9)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


# The next sitecustomize on the path (the engine-start counter's), which this one shadows.
here = Path(__file__).resolve().parent
for entry in sys.path:
    candidate = Path(entry or ".").resolve() / "sitecustomize.py"
    if candidate.is_file() and candidate.parent != here:
        spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
        if spec is not None and spec.loader is not None:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        break
# After it: its own finder of the engine module, which this one then wraps, goes first otherwise.
sys.meta_path.insert(0, _CrashOnEngine())
