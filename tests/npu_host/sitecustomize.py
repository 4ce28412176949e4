"""Test-only, never shipped: the NPU host the user lane (tests/test_user_lane.py) simulates has one device node.

rbln-retrieval counts NPUs by their device nodes (/dev/rbln0, ...), which a test cannot create. Python imports this
module at start-up when its folder is on PYTHONPATH (with tests/standin, the stand-in for rebel-compiler, beside it),
in the program the test runs and in every process that program starts, so all of them see /dev/rbln0.
"""

import glob

DEVICE_NODES = "/dev/rbln[0-9]*"
_glob = glob.glob


def _with_the_device(pathname, *args, **kwargs):
    return ["/dev/rbln0"] if pathname == DEVICE_NODES else _glob(pathname, *args, **kwargs)


glob.glob = _with_the_device
