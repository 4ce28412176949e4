"""What a replica's answer must be before RemoteEngine hands it on: the client distrusts the server.

A pooling answer's ``data`` holds one row per input, each index 0..n-1 exactly once; a vector row is base64 of the
width and dtype the call asked for (float32, or the quantized dtype of the precision asked, never the dtype the
server names); a score is a number a float holds. Anything else raises BadAnswer with a phrase that
rbln_retrieval.remote.replicas turns into one sentence naming the replica. Values are then checked finite where
every result is in (rbln_retrieval.results.finite), so NonFiniteResultError names the input in the whole call.

Imports: numpy.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

# The dtype of each quantized precision's rows, and how many dimensions one of its elements holds.
QUANTIZED_DTYPES = {"int8": ("int8", 1), "uint8": ("uint8", 1), "binary": ("int8", 8), "ubinary": ("uint8", 8)}


class BadAnswer(ValueError):
    """An answer that breaks the protocol; the message is a phrase ("index 3 twice"), the caller names the replica."""


def rows_by_index(answer: Any, count: int) -> list[dict[str, Any]]:
    """The ``count`` rows of ``answer["data"]`` in input order, each index 0..count-1 present exactly once."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise BadAnswer("JSON without a list of results in 'data'")
    if len(data) != count:
        raise BadAnswer(f"{len(data)} results for {count} inputs")
    rows: dict[int, dict[str, Any]] = {}
    for row in data:
        index = row.get("index") if isinstance(row, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise BadAnswer(f"a result with index {index!r}, outside 0 to {count - 1}")
        if index in rows:
            missing = min(set(range(count)) - set(rows) - {index})
            raise BadAnswer(f"index {index} twice and no index {missing}")
        rows[index] = row
    return [rows[i] for i in range(count)]


def vector_rows(answer: Any, count: int, *, width: int, dtype: str = "<f4") -> list[np.ndarray]:
    """The ``count`` vectors of an embeddings answer in input order, each ``width`` elements of ``dtype`` (0: any
    width, the same for all)."""
    kind = np.dtype(dtype)
    out: list[np.ndarray] = []
    for i, row in enumerate(rows_by_index(answer, count)):
        try:
            raw = base64.b64decode(row["embedding"], validate=True)
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise BadAnswer(f"result {i} without a base64 embedding") from None
        size, extra = divmod(len(raw), kind.itemsize)
        expected = width or (len(out[0]) if out else size)
        if extra or size != expected:
            asked = f"{expected} {kind.name} values"
            raise BadAnswer(f"a vector of {len(raw)} bytes for input {i}, where {asked} were asked")
        out.append(np.frombuffer(raw, dtype=kind))
    return out


def quantized_rows(answer: Any, count: int, *, precision: str, dimensions: int) -> list[np.ndarray]:
    """The rows of a quantized embeddings answer for ``precision`` (the dtype this client asked for; the answer's
    ``dtype`` must agree with it), ``dimensions`` wide (0: unknown)."""
    name, per_element = QUANTIZED_DTYPES[precision]
    said = answer.get("dtype") if isinstance(answer, dict) else None
    if said != name:
        raise BadAnswer(f"dtype {said!r} for precision {precision!r}, which is {name}")
    return vector_rows(answer, count, width=math.ceil(dimensions / per_element), dtype=name)


def output_rows(answer: Any, count: int, names: tuple[str, ...]) -> list[dict[str, Any]]:
    """The ``count`` rows of an outputs answer (an `rbln-retrieval serve` server's POST OUTPUTS_PATH) in input order,
    each of ``names`` decoded as the local engine gives it: dense a float32 vector (one width for all rows), sparse
    ``{token id: weight}``, multi_vector a (tokens, width) float32 matrix."""
    out: list[dict[str, Any]] = []
    for i, row in enumerate(rows_by_index(answer, count)):
        decoded: dict[str, Any] = {}
        for name in names:
            try:
                decoded[name] = _READERS[name](row[name])
            except (KeyError, TypeError, ValueError, binascii.Error):
                raise BadAnswer(f"result {i} without a valid {name} output") from None
        if "dense" in decoded and out and len(decoded["dense"]) != len(out[0]["dense"]):
            raise BadAnswer(
                f"a dense vector of {len(decoded['dense'])} values for input {i}, after {len(out[0]['dense'])}"
            )
        out.append(decoded)
    return out


def _float32(data: Any) -> np.ndarray:
    raw = base64.b64decode(data, validate=True)
    if len(raw) % 4:
        raise ValueError("not whole float32 values")
    return np.frombuffer(raw, dtype="<f4")


def _sparse(value: Any) -> dict[int, float]:
    indices, values = value["indices"], value["values"]
    if not isinstance(indices, list) or not isinstance(values, list) or len(indices) != len(values):
        raise ValueError("indices and values differ")
    weights: dict[int, float] = {}
    for index, weight in zip(indices, values, strict=True):
        number = _number(weight)
        if isinstance(index, bool) or not isinstance(index, int) or index < 0 or index in weights or number is None:
            raise ValueError("not a token id and a weight")
        weights[index] = number
    return weights


def _matrix(value: Any) -> np.ndarray:
    shape = value["shape"]
    if not (isinstance(shape, list) and len(shape) == 2 and all(type(n) is int and n >= 0 for n in shape)):
        raise ValueError("not a (tokens, width) shape")
    return _float32(value["data"]).reshape(shape)


_READERS = {"dense": _float32, "sparse": _sparse, "multi_vector": _matrix}


def score_rows(answer: Any, count: int, field: str) -> list[float]:
    """The ``count`` scores of a /score or /classify answer in input order (``field``: "score", or "probs"
    whose first element is taken)."""
    scores = []
    for i, row in enumerate(rows_by_index(answer, count)):
        value = row.get(field)
        if field == "probs":
            value = value[0] if isinstance(value, list) and value else None
        number = _number(value)
        if number is None:
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:40]}..."
            raise BadAnswer(f"{shown} as the score of input {i}, not a number")
        scores.append(number)
    return scores


def _number(value: Any) -> float | None:
    """``value`` as a float, or None (not a number, a bool, or an int no float holds); NaN and infinities pass, for
    the finite check of the whole call to name their input."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None
