"""Non-finite results refused: a vector or score holding NaN or an infinity (an overflow in a reduced-precision
compute dtype, a broken checkpoint, a server that sends one) is never handed on, where it would rank anywhere and
poison a vector index silently.

Imports: numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NonFiniteResultError(ArithmeticError):
    """The model produced NaN or an infinity for an input; the message names the first such input."""


def check_finite(values: np.ndarray | Sequence[float], what: str = "texts", first_index: int = 0) -> None:
    """Raise NonFiniteResultError naming the first of ``what`` (rows of ``values``, counted from ``first_index``)
    whose vector or score holds NaN or an infinity."""
    array = np.asarray(values, dtype=np.float64 if not isinstance(values, np.ndarray) else None)
    if array.dtype.kind != "f" or len(array) == 0:
        return
    finite = np.isfinite(array.reshape(len(array), -1)).all(axis=1)
    if finite.all():
        return
    bad = np.flatnonzero(~finite)
    index = int(bad[0])
    value = array.reshape(len(array), -1)[index]
    shown = "NaN" if np.isnan(value).any() else "an infinity"
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise NonFiniteResultError(
        f"The result for {what[:-1] if what.endswith('s') else what} {first_index + index}{more} holds {shown}: the "
        "model's output overflowed or its weights are broken, so it is refused rather than ranked or stored."
    )


def finite_scores(scores: Sequence[float], what: str = "documents") -> list[float]:
    """``scores`` as floats, checked by check_finite."""
    floats = [float(s) for s in scores]
    check_finite(floats, what)
    return floats
