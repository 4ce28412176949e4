"""Test-only, never shipped: the NPU host the user lane (tests/user_lane/test_user_lane.py) simulates has one device
node, or as many as REBEL_STANDIN_DEVICES says (the stand-in compiler's count of NPUs, tests/standin).

rbln-retrieval counts NPUs by their device nodes (/dev/rbln0, ...), which a test cannot create. Python imports this
module at start-up when its folder is on PYTHONPATH (with tests/standin, the stand-in for rebel-compiler, beside it),
in the program the test runs and in every process that program starts, so all of them see /dev/rbln0. The next
sitecustomize on the path, which this one shadows (the suite's engine-start counter, tests/engine_count), runs too.
"""

import glob
import importlib.util
import os
import sys
from pathlib import Path

DEVICE_NODES = "/dev/rbln[0-9]*"
_glob = glob.glob


def _with_the_device(pathname, *args, **kwargs):
    if pathname != DEVICE_NODES:
        return _glob(pathname, *args, **kwargs)
    return [f"/dev/rbln{index}" for index in range(int(os.environ.get("REBEL_STANDIN_DEVICES", "1")))]


glob.glob = _with_the_device

_here = Path(__file__).resolve().parent
_shadowed = [Path(entry or ".").resolve() / "sitecustomize.py" for entry in sys.path]
for _candidate in (path for path in _shadowed if path.is_file() and path.parent != _here):
    _spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", _candidate)
    if _spec is not None and _spec.loader is not None:
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
    break
