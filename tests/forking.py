"""Run a function in a child process (fork or spawn) with a deadline, so a hang fails the test instead of
blocking it, and bring back its result or its error."""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from typing import Any


def _report(queue: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        queue.put(("ok", fn(*args)))
    except BaseException as exc:  # the parent asserts on it
        queue.put(("error", type(exc).__name__, str(exc), traceback.format_exc()))


def run_in_child(method: str, fn: Callable[..., Any], *args: Any, deadline: float = 180) -> tuple[Any, ...]:
    """("ok", result) or ("error", type name, message, traceback); fails if the child is not done by ``deadline``."""
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    child = context.Process(target=_report, args=(queue, fn, args))
    child.start()
    child.join(deadline)
    hung = child.is_alive()
    if hung:
        child.kill()
        child.join()
    assert not hung, f"the {method} child was still running after {deadline} s (a hang)"
    return queue.get(timeout=10)
