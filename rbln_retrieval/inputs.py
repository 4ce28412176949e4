"""Validate caller input before anything reaches the engine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def check_texts(texts: Iterable[Any], what: str = "texts", *, first_index: int = 0) -> list[str]:
    """Return ``texts`` as a list of str, or raise TypeError naming the first item that is not one.

    ``first_index`` is the position of ``texts[0]`` in the caller's whole input, so chunks name global indices.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{what} must be a list of strings, not a single {type(texts).__name__}.")
    items = list(texts)
    for index, text in enumerate(items):
        if not isinstance(text, str):
            raise TypeError(f"{what}[{first_index + index}] is {type(text).__name__}, expected str.")
    return items


def check_query(query: Any) -> str:
    if not isinstance(query, str):
        raise TypeError(f"query is {type(query).__name__}, expected str.")
    if not query.strip():
        raise ValueError("query is empty; a relevance score needs a query to compare against.")
    return query


def check_dimensions(dimensions: int | None, *, hidden_size: int, matryoshka: bool, model: str) -> int | None:
    if dimensions is None:
        return None
    if isinstance(dimensions, bool) or not isinstance(dimensions, int):
        raise TypeError(f"dimensions is {type(dimensions).__name__}, expected int.")
    if not matryoshka:
        raise ValueError(f"{model} does not support matryoshka dimensions; leave dimensions unset.")
    if not 1 <= dimensions <= hidden_size:
        raise ValueError(f"dimensions={dimensions} is outside 1..{hidden_size} for {model}.")
    return dimensions
