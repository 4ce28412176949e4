"""Counts the engine starts of a process the test suite starts (tests/engine_budget.py puts this folder on the
PYTHONPATH of the suite's subprocesses): once ``rbln_retrieval.local.engine`` is imported, each start of a
PoolingEngine appends one line, the starting test's file (from PYTEST_CURRENT_TEST), to RBLN_TEST_ENGINE_STARTS."""

import importlib.abc
import importlib.machinery
import os
import sys

MODULE = "rbln_retrieval.local.engine"
LOG = os.environ.get("RBLN_TEST_ENGINE_STARTS")


def _count_starts(module):
    start = module.PoolingEngine._start

    async def counted(self):
        with open(LOG, "a", encoding="utf-8") as log:
            test = os.environ.get("PYTEST_CURRENT_TEST", "outside a test")
            log.write(test.split("::")[0] + "\n")
        await start(self)

    counted.__wrapped__ = start  # a pytest-xdist worker inherits this counter: its budget unwraps it (in-process)
    module.PoolingEngine._start = counted


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the engine module with the regular finders, then counts its starts once it has executed."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                _count_starts(module)

            spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Finder())
