"""Validate caller input before anything reaches the engine.

Imports nothing.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast


@dataclass(frozen=True)
class Chunk:
    """``truncate=Chunk(...)``: an over-long text is cut into windows of the model's length that overlap by
    ``overlap`` tokens, each read as a whole model input; ``embed`` gives the token-weighted mean of the windows'
    vectors (``output="mean"``, normalized again when the call normalizes) or every window's vector with its span
    (``output="all"``), ``score``/``rerank`` the best window's score (rbln_retrieval.text.chunks).
    ``truncate="chunk"`` is ``Chunk()``."""

    overlap: int = 0
    output: Literal["mean", "all"] = "mean"

    def __post_init__(self) -> None:
        if isinstance(self.overlap, bool) or not isinstance(self.overlap, int):
            raise TypeError(f"Chunk overlap is {type(self.overlap).__name__}, expected int (tokens).")
        if self.overlap < 0:
            raise ValueError(f"Chunk overlap={self.overlap} is negative; windows overlap by 0 or more tokens.")
        if self.output not in ("mean", "all"):
            raise ValueError(f"Chunk output={self.output!r} is not 'mean' (one vector per text) or 'all'.")


Truncate = Literal["end", "start", "error", "chunk"] | Chunk
TRUNCATE_MODES = ("end", "start", "error", "chunk")

# Inputs are consumed, validated and submitted this many at a time, so an iterator of millions of texts holds
# only one chunk in memory while the engine works.
CHUNK_SIZE = 1024

# A Python str can hold surrogate code points (what errors="surrogateescape" decoding leaves for undecodable
# bytes) that are not characters and cannot be encoded; the tokenizers and JSON reject them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_sequence(texts: Any, what: str = "texts") -> None:
    """Refuse a value that iterates but is not a sequence of texts: a string, bytes, None or a mapping."""
    if isinstance(texts, (str, bytes)) or texts is None:
        raise TypeError(f"{what} must be a list of strings, not {type(texts).__name__}.")
    if isinstance(texts, Mapping):
        raise TypeError(
            f"{what} must be a list of strings, not a {type(texts).__name__} (its keys would be embedded; "
            f"pass list({what}.values()) for its values)."
        )


def valid_unicode(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD, as decoding with errors="replace" would have done."""
    if text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def check_texts(texts: Iterable[Any], what: str = "texts", *, first_index: int = 0) -> list[str]:
    """Return ``texts`` as a list of valid Unicode str, or raise TypeError naming the first item that is not a str.

    ``first_index`` is the position of ``texts[0]`` in the caller's whole input, so chunks name global indices.
    """
    check_sequence(texts, what)
    items = list(texts)
    for index, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"{what}[{first_index + index}] is {type(text).__name__}, expected str.")
        items[index] = valid_unicode(text)
    return items


def chunks(texts: Iterable[Any], what: str = "texts") -> Iterator[tuple[int, list[str]]]:
    """(index of first item, validated chunk) pairs; raises TypeError naming the global index of a bad item."""
    check_sequence(texts, what)
    iterator = iter(texts)
    first = 0
    while chunk := list(itertools.islice(iterator, CHUNK_SIZE)):
        yield first, check_texts(chunk, what, first_index=first)
        first += len(chunk)


def check_query(query: Any) -> str:
    if not isinstance(query, str):
        raise TypeError(f"query is {type(query).__name__}, expected str.")
    if not query.strip():
        raise ValueError("query is empty; a relevance score needs a query to compare against.")
    return valid_unicode(query)


def check_truncate(truncate: Any, precision: str = "float32") -> Truncate:
    if isinstance(truncate, Chunk):
        if truncate.output == "all" and precision != "float32":
            raise ValueError(
                f"Chunk(output='all') gives float32 window vectors; precision={precision!r} applies to "
                "output='mean' (quantize the windows' vectors yourself)."
            )
        return truncate
    if truncate not in TRUNCATE_MODES:
        raise ValueError(f"truncate={truncate!r} is not one of 'end', 'start', 'error', 'chunk' or a Chunk(...).")
    return cast(Truncate, truncate)


def chunking(truncate: Truncate) -> Chunk | None:
    """The windows ``truncate`` asks for, or None for a policy that cuts (or refuses) an over-long input."""
    if isinstance(truncate, Chunk):
        return truncate
    return Chunk() if truncate == "chunk" else None


def check_dimensions(
    dimensions: int | None, *, hidden_size: int, matryoshka: bool, model: str, sizes: Sequence[int] = ()
) -> int | None:
    """``sizes``: the only sizes the model was trained to be truncated to (empty: any up to ``hidden_size``)."""
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise TypeError(f"dimensions is {type(dimensions).__name__}, expected int.")
    if not matryoshka:
        raise ValueError(f"{model} does not support matryoshka dimensions; leave dimensions unset.")
    if sizes and dimensions not in sizes:
        raise ValueError(
            f"dimensions={dimensions} is not one of the sizes {model} was trained for ({', '.join(map(str, sizes))})."
        )
    if not 1 <= dimensions <= hidden_size:
        raise ValueError(f"dimensions={dimensions} is outside 1..{hidden_size} for {model}.")
    return dimensions
