"""The two-worker lane (`make test`: pytest-xdist, ``-n 2 --dist loadfile``): which tests share a worker, in what
order the work goes out, and each worker's compute threads. Most of the suite's time is engine and server starts,
largely single-threaded Python, so a second worker on a 2-core machine nearly halves it.

- A test file is one unit of work, so its module fixtures (an engine per family, a server) start once. Files that
  name a session resource below form one unit with each other (and with the files sharing another resource with
  them): each session server starts once, and no two local Ray clusters run at once. Session engines
  (``minilm_engine``, ``tiny_engine``, ...) start once per worker.
- The costliest unit goes out first, and each unit goes out only when a worker is about to wait for one, so the two
  workers finish together.
- A worker's in-process engines compute on its share of the cores (``torch.set_num_threads``): two OpenMP teams
  of two threads on two cores wait on each other's barriers. Processes the tests start keep the environment a user
  has (nothing is set in ``os.environ``).

Loaded from the root conftest.py (``pytest_plugins``); the hooks do nothing without pytest-xdist."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# Files naming one of these fixtures share a worker, in one unit of work.
SHARED_BY_FILES = ("ray_cluster", "minilm_server", "reranker_server")
# A file names a fixture as a function's parameter or in request.getfixturevalue (not in a string or a comment).
NAMES = r"\bdef \w+\([^)]*\b{name}\b|getfixturevalue\(\s*[\"']{name}[\"']"

# Rough seconds per file in one worker of `make test` on the 2-core AVX2 EPYC (CI's runs' longest tests and
# bench/results/suite-time.md; an engine start is 10-25 s, a server's 30-360 s under load): only their order matters.
# Any other file: a second per test. The Ray unit is the longest (its files run one after another on one worker), so
# it goes out first; the MiniLM server's unit (the files naming minilm_server or reranker_server) is next.
EXPECTED_SECONDS = {
    "tests/ray/test_ray_data.py": 480,
    "tests/ray/test_ray_serve.py": 420,
    "tests/ray/test_docs_ray.py": 190,
    "tests/backend/test_parity.py": 700,
    "tests/remote/test_remote.py": 650,
    "tests/user_lane/test_user_lane.py": 520,
    "tests/user_lane/test_demo.py": 360,
    "tests/user_lane/test_wheel_install.py": 330,
    "tests/server/test_http_clients.py": 320,
    "tests/user_lane/test_examples.py": 260,
    "tests/server/test_multi_model_serve.py": 250,
    "tests/server/test_npu_placement.py": 150,
    "tests/frameworks/test_shared_engine.py": 220,
    "tests/server/test_http_fuzz.py": 200,
    "tests/backend/test_rbln_target.py": 200,
    "tests/engine/test_faults.py": 180,
    "tests/backend/test_compile_cache.py": 150,
    "tests/backend/test_rbln_routes.py": 150,
    "tests/project/test_docs.py": 150,
    "tests/server/test_serving.py": 150,
    "tests/engine/test_concurrency.py": 130,
    "tests/engine/test_families.py": 120,
    "tests/user_lane/test_cli.py": 120,
    "tests/engine/test_chunking.py": 80,
    "tests/engine/test_precision.py": 80,
    "tests/frameworks/test_framework_objects.py": 80,
    "tests/engine/test_bge_m3.py": 60,
    "tests/engine/test_splade.py": 60,
    "tests/backend/test_bfloat16.py": 60,
}


def units_of(paths, root: Path) -> dict[str, str]:
    """The unit of work of each test file (paths relative to the rootdir): files naming a shared fixture, and the
    files sharing any of their fixtures, form one unit named after its first fixture in SHARED_BY_FILES (a file
    naming two joins their units: each session server starts on one worker only); any other file is its own."""
    named = {}
    for path in paths:
        file = root / path
        text = file.read_text(encoding="utf-8") if file.suffix == ".py" and file.is_file() else ""
        named[path] = [name for name in SHARED_BY_FILES if re.search(NAMES.format(name=name), text)]
    parent = {name: name for name in SHARED_BY_FILES}

    def find(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for names in named.values():
        for name in names[1:]:
            first, other = sorted((find(names[0]), find(name)), key=SHARED_BY_FILES.index)
            parent[other] = first
    return {path: find(names[0]) if names else path for path, names in named.items()}


def expected_seconds(nodeids) -> int:
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    return len(nodeids) + sum(EXPECTED_SECONDS.get(file, 0) for file in files)


def _scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        """xdist's loadfile with the shared-resource units above, the costliest unit sent first."""

        def __init__(self, config: pytest.Config, log) -> None:
            super().__init__(config, log)
            self.units: dict[str, str] = {}

        def _split_scope(self, nodeid: str) -> str:
            if not self.units:  # xdist splits scopes once the collection is complete
                self.units = units_of({item.split("::", 1)[0] for item in self.collection}, config.rootpath)
            return self.units[nodeid.split("::", 1)[0]]

        def _assign_work_unit(self, node) -> None:
            costliest = max(self.workqueue, key=lambda unit: expected_seconds(self.workqueue[unit]))
            self.workqueue.move_to_end(costliest, last=False)
            super()._assign_work_unit(node)

        def _reschedule(self, node) -> None:
            # xdist hands a worker its next unit while two of its tests are pending; a worker holds its last test
            # until it has a next one (or is told to stop), so one pending test is when it starts to wait: each
            # unit goes out as late as it can, to the worker that is free first, and no unit waits behind a long
            # test while the other worker runs out of work.
            if node.shutting_down or not self.workqueue or self._pending_of(self.assigned_work[node]) <= 1:
                super()._reschedule(node)

    return FileGroups(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """--dist loadfile: xdist's file units, regrouped and ordered as above; other --dist modes are xdist's own."""
    return _scheduler(config, log) if config.getvalue("dist") == "loadfile" else None


@pytest.hookimpl(tryfirst=True)  # before any engine: vLLM's CPU worker disables torch.set_num_threads once it binds
def pytest_configure(config: pytest.Config) -> None:
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
