"""Quantized embeddings (``precision=``): float32 rows to int8/uint8 (per-dimension scalar quantization) or
binary/ubinary (sign bits packed 8 per byte), with sentence-transformers' ``quantize_embeddings`` semantics, so
vectors stored from either library compare bit for bit. Not to be confused with precision.py (compute dtypes).

int8/uint8 need per-dimension ranges (a (2, dim) array of minima and maxima). sentence-transformers computes them
from the batch being quantized when given neither ranges nor calibration embeddings; here that is refused: a
query embedded alone and the same text embedded in a batch would then get different codes. Callers pass ``ranges``
or ``calibration_embeddings`` (from which ``quantization_ranges`` computes them, as sentence-transformers does).

Imports: numpy only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

import numpy as np

Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]
PRECISIONS: tuple[str, ...] = get_args(Precision)


def check_precision(
    precision: str,
    ranges: object = None,
    calibration_embeddings: object = None,
    *,
    output: object = "dense",
) -> Precision:
    """``precision`` if it is known and fits the other arguments (checked before any work), else ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}.")
    dense = isinstance(output, str) and output == "dense"
    if precision != "float32" and not dense:
        raise ValueError(f"precision={precision!r} applies to dense vectors only, not output={output!r}.")
    calibrated = ranges is not None or calibration_embeddings is not None
    if precision.endswith("int8") and not calibrated:
        raise ValueError(
            f"precision={precision!r} needs ranges (a (2, dim) array of per-dimension minima and maxima) or "
            "calibration_embeddings (float vectors of a representative set) to scale each dimension."
        )
    if not precision.endswith("int8") and calibrated:
        raise ValueError(f"ranges and calibration_embeddings apply to int8 and uint8 only, not to {precision!r}.")
    if ranges is not None and calibration_embeddings is not None:
        raise ValueError("Pass ranges or calibration_embeddings, not both.")
    return precision  # type: ignore[return-value]


def quantization_ranges(calibration_embeddings: np.ndarray) -> np.ndarray:
    """The (2, dim) per-dimension minima and maxima of float ``calibration_embeddings`` (n, dim)."""
    calibration = np.asarray(calibration_embeddings)
    if calibration.ndim != 2 or len(calibration) == 0 or calibration.dtype.kind != "f":
        raise ValueError(
            "calibration_embeddings must be a non-empty float array of shape (n, dim), not "
            f"{calibration.dtype} of shape {calibration.shape}."
        )
    return np.vstack((np.min(calibration, axis=0), np.max(calibration, axis=0)))


def resolve_ranges(
    precision: str, ranges: np.ndarray | None, calibration_embeddings: np.ndarray | None, dim: int
) -> np.ndarray | None:
    """The float32 (2, dim) ranges int8/uint8 scale by (None for the other precisions), checked against ``dim``."""
    if not precision.endswith("int8"):
        return None
    if ranges is None:
        ranges = quantization_ranges(np.asarray(calibration_embeddings))
    ranges = np.asarray(ranges)
    what = "ranges" if calibration_embeddings is None else "calibration_embeddings' ranges"
    if ranges.shape != (2, dim) or ranges.dtype.kind not in "fiu":
        raise ValueError(f"{what} must have shape (2, {dim}) for {dim}-dimensional vectors, not {ranges.shape}.")
    scale = ranges.astype(np.float32, copy=False)
    if not np.isfinite(scale).all():  # NaN or an infinity would put every value of its dimension in one bucket
        column = int(np.flatnonzero(~np.isfinite(scale).all(axis=0))[0])
        raise ValueError(f"{what} must be finite numbers, but dimension {column} has {scale[:, column].tolist()}.")
    return scale


def quantizer(
    precision: str,
    ranges: np.ndarray | None,
    calibration_embeddings: np.ndarray | None,
    *,
    output: object,
    dim: int,
) -> Callable[[Any], Any]:
    """What an engine's ``embed`` applies to its float32 result, every argument checked before the texts are
    embedded (``dim``: the vectors' size, ``dimensions`` or the model's)."""
    precision = check_precision(precision, ranges, calibration_embeddings, output=output)
    if precision == "float32":
        return lambda vectors: vectors
    scale = resolve_ranges(precision, ranges, calibration_embeddings, dim)
    return lambda vectors: quantize_embeddings(vectors, precision, scale)


def quantize_embeddings(
    embeddings: np.ndarray,
    precision: str,
    ranges: np.ndarray | None = None,
    calibration_embeddings: np.ndarray | None = None,
) -> np.ndarray:
    """``embeddings`` (n, dim) float in ``precision``: float32 (n, dim); int8/uint8 (n, dim), each dimension cut
    into 256 buckets between its range's minimum and maximum; ubinary (n, ceil(dim / 8)) uint8, the bits of
    ``x > 0`` packed big-endian; binary the same bytes minus 128 as int8. Equal to sentence-transformers'
    ``quantize_embeddings`` wherever that one is given ranges or calibration embeddings."""
    precision = check_precision(precision, ranges, calibration_embeddings)
    embeddings = np.asarray(embeddings)
    if embeddings.ndim != 2 or embeddings.dtype.kind != "f":
        raise ValueError(
            f"embeddings must be a float array of shape (n, dim), not {embeddings.dtype} {embeddings.shape}."
        )
    scale = resolve_ranges(precision, ranges, calibration_embeddings, embeddings.shape[1])
    if precision == "float32":
        return embeddings.astype(np.float32)
    if scale is not None:
        starts = scale[0, :]
        steps = (scale[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)  # a constant dimension: every value falls in bucket 0
        buckets: np.ndarray = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)
    packed = np.packbits(embeddings > 0, axis=-1)
    # The uint8 subtraction wraps before the cast, exactly as sentence-transformers computes it.
    return packed if precision == "ubinary" else (packed - 128).astype(np.int8)
