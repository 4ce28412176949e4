"""Test-only, never shipped: the simulated NPU host of tests/user_lane/test_user_lane.py has one device node.

rbln-retrieval counts NPUs by their device nodes (/dev/rbln0, ...), which a test cannot create. Python imports this
module at start-up when its folder is on PYTHONPATH (with tests/standin, the stand-in for rebel-compiler, beside it),
in the program the test runs and in every process that program starts, so all of them see /dev/rbln0. The next
sitecustomize on the path, which this one shadows (the suite's engine-start counter, tests/engine_count), runs too.
"""

import glob
import importlib.util
import sys
from pathlib import Path

DEVICE_NODES = "/dev/rbln[0-9]*"
_glob = glob.glob


def _with_the_device(pathname, *args, **kwargs):
    return ["/dev/rbln0"] if pathname == DEVICE_NODES else _glob(pathname, *args, **kwargs)


glob.glob = _with_the_device

_here = Path(__file__).resolve().parent
_shadowed = [Path(entry or ".").resolve() / "sitecustomize.py" for entry in sys.path]
for _candidate in (path for path in _shadowed if path.is_file() and path.parent != _here):
    _spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", _candidate)
    if _spec is not None and _spec.loader is not None:
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
    break
