"""What a request will cost the server, read from its JSON body before anything is tokenized: how many inputs it
asks for, the characters of each, and the tokens vLLM will tokenize for it.

The body's size alone underestimates a scoring request: vLLM's /score and /rerank (their /v1, /v2 forms and
/invocations) pair the query with every document and tokenize each pair whole before any truncation, so a query is
tokenized once per document. Here a pair costs the query's size plus the document's; any other request costs its
body's size. Sizes are UTF-8 bytes, TOKEN_BYTES a token (English text's usual size), as the body-size estimate
always was.

Imports: nothing beyond the standard library.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

TOKEN_BYTES = 4

# The (first, second) fields of a scoring request, in the order vLLM's request models try them; the first side is
# the query, repeated against every item of the second when it is one.
PAIR_FIELDS = (
    ("query", "documents"),
    ("queries", "documents"),
    ("queries", "items"),
    ("data_1", "data_2"),
    ("text_1", "text_2"),
)
# vLLM's scoring routes, and SageMaker's /invocations, which serves a scoring request by its body's shape.
PAIR_PATHS = frozenset({"/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/invocations"})
# Where other pooling requests carry their inputs: OpenAI's and vLLM's `input`, Cohere's `texts`/`inputs`,
# chat-style `messages`, /tokenize's `prompt`.
INPUT_FIELDS = ("input", "texts", "inputs", "messages", "prompt")
# Where a structured input (a message, a content part) holds text for the tokenizer.
TEXT_KEYS = ("content", "text")


@dataclass(frozen=True)
class Cost:
    """A request's inputs (texts, or pairs for scoring), ``what`` the field that holds them ("documents", "input"),
    its longest input (its name, e.g. ``documents[3]``, and characters) and its estimated tokens."""

    inputs: int
    what: str
    longest: tuple[str, int] | None
    tokens: int
    # How the tokens were counted, for the message that refuses them.
    basis: str


def body_cost(body: bytes) -> Cost:
    """The estimate for a body that is not a request this module reads (not JSON, no known input field)."""
    return Cost(0, "inputs", None, math.ceil(len(body) / TOKEN_BYTES), f"{len(body)} bytes")


def request_cost(path: str, body: bytes) -> Cost:
    """The cost of POSTing ``body`` to ``path``. A body vLLM will refuse anyway (not JSON, no inputs) costs its
    bytes; vLLM then answers it with its own 400."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError; a body nested too deep, the check's
        return body_cost(body)
    if not isinstance(request, dict):
        return body_cost(body)
    if path in PAIR_PATHS:
        for first, second in PAIR_FIELDS:
            if first in request and second in request:
                return _pairs_cost(body, first, request[first], second, request[second])
    for field in INPUT_FIELDS:
        if field in request:
            items = _items(field, request[field])
            return _cost(field, items, len(items), len(body), f"{len(body)} bytes")
    return body_cost(body)


def _pairs_cost(body: bytes, first: str, queries: Any, second: str, documents: Any) -> Cost:
    """A scoring request: vLLM pairs one query with every document (1:N) or the i-th query with the i-th document
    (N:N), and tokenizes every pair whole."""
    queries, documents = _sides(queries), _sides(documents)
    items = [(f"{first}[{i}]" if len(queries) > 1 else first, q) for i, q in enumerate(queries)]
    items += [(f"{second}[{i}]", d) for i, d in enumerate(documents)]
    query_bytes = [_size(q) for q in queries]
    pair_bytes = sum(_size(d) for d in documents)
    if len(queries) == 1:
        pair_bytes += query_bytes[0] * len(documents)
        basis = f"the {query_bytes[0]}-byte {first} counted with each of the {len(documents)} {second}"
    else:
        pair_bytes += sum(query_bytes)
        basis = f"{len(queries)} {first} and {len(documents)} {second} of {pair_bytes} bytes"
    tokens_bytes = max(pair_bytes, len(body))
    return _cost(second, items, max(len(queries), len(documents)), tokens_bytes, basis)


def _cost(what: str, items: list[tuple[str, Any]], inputs: int, size: int, basis: str) -> Cost:
    longest = max(((name, _chars(item)) for name, item in items), key=lambda pair: pair[1], default=None)
    return Cost(inputs, what, longest, math.ceil(size / TOKEN_BYTES), basis)


def _sides(value: Any) -> list[Any]:
    """A side of a scoring request as a list: one input, or a list of them."""
    return value if isinstance(value, list) else [value]


def _items(field: str, value: Any) -> list[tuple[str, Any]]:
    """The inputs of a non-scoring request's ``field``, each named: one text, one prompt of token ids or one
    conversation, or a list of them; TEI's similarity ``{"source_sentence", "sentences"}``: each sentence."""
    if isinstance(value, dict) and isinstance(value.get("sentences"), list):
        sentences = [(f"{field}.sentences[{i}]", item) for i, item in enumerate(value["sentences"])]
        return [(f"{field}.source_sentence", value.get("source_sentence")), *sentences]
    if isinstance(value, list) and value and not _is_one_input(value):
        return [(f"{field}[{i}]", item) for i, item in enumerate(value)]
    return [(field, value)]


def _is_one_input(value: list[Any]) -> bool:
    """A list that is one input: token ids, or a conversation (messages with roles)."""
    return all(isinstance(v, int) for v in value) or all(isinstance(v, dict) and "role" in v for v in value)


def _texts(value: Any) -> Iterator[str]:
    """The text inside an input: a string, a multimodal item's text parts, a conversation's contents (not their
    roles, part types or media)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key in TEXT_KEYS:
            yield from _texts(value.get(key))
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)


def _chars(value: Any) -> int:
    return len(value) if isinstance(value, str) else sum(len(text) for text in _texts(value))


def _size(value: Any) -> int:
    """An input's size as the tokenizer meets it: UTF-8 bytes of its text, TOKEN_BYTES a token id."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return len(value) * TOKEN_BYTES
    return sum(len(text.encode()) for text in _texts(value))
