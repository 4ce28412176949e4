"""The engine calls every dialect's handlers share: texts embedded (as given, or with the model's query or document
prompt), scores of documents against a query, token counts for the answers' usage, and vectors on the wire.

Imports: engines (requests), server (check, served), text (inputs); numpy.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np

from rbln_retrieval.engines.requests import Kind
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.served import Served
from rbln_retrieval.text.inputs import Truncate


async def embed_texts(
    served: Served,
    texts: list[str],
    *,
    kind: Kind | None,
    normalize: bool = True,
    truncate: Truncate = "end",
    dimensions: int | None = None,
    output: Any = "dense",
) -> Any:
    """The engine's ``aembed``: ``kind`` None embeds the texts as given (the client put any prompt in them, as
    RemoteEngine and OpenAI clients do), else with the model's query or document prompt."""
    if not texts:
        raise Refused("The request has no texts to embed.", "empty")
    options: dict[str, Any] = {"normalize": normalize, "truncate": truncate, "output": output}
    if dimensions is not None:
        options["dimensions"] = dimensions
    if kind is None:
        options["instruction"] = ""
    else:
        options["kind"] = kind
    return await served.engine.aembed(texts, **options)


async def embed_ids(
    served: Served,
    ids: list[list[int]],
    *,
    normalize: bool,
    truncate: Truncate,
    dimensions: int | None,
) -> Any:
    """The engine's ``aembed_ids``: dense vectors of token ids as given, each id checked against the vocabulary."""
    embed = getattr(served.engine, "aembed_ids", None)
    if embed is None:
        raise Refused(f"{served.name} embeds texts on this server; send `input` as text.")
    check_token_ids(served, ids, "input", flat=False)
    options: dict[str, Any] = {"normalize": normalize, "truncate": truncate}
    if dimensions is not None:
        options["dimensions"] = dimensions
    return await embed(ids, **options)


def check_token_ids(served: Served, rows: list[list[int]], field: str, *, flat: bool) -> None:
    """Refuses an empty prompt or an id outside ``served``'s vocabulary, naming it (``flat``: one prompt)."""
    tokenizer = getattr(served.engine, "tokenizer", None)
    if tokenizer is None:
        raise Refused(f"{served.name}'s tokenizer is not available on this server.", "wrong_model")
    vocabulary = len(tokenizer.hf)
    for row, sequence in enumerate(rows):
        if not sequence and not flat:
            raise Refused(f"`{field}[{row}]` holds no token ids.")
        for position, token in enumerate(sequence):
            if not 0 <= token < vocabulary:
                where = f"{field}[{position}]" if flat else f"{field}[{row}][{position}]"
                raise Refused(f"`{where}` is {token}, not a token id of this model (0 to {vocabulary - 1}).")


async def scores(
    served: Served, query: str, documents: list[str], truncate: Truncate = "end", instruction: str | None = None
) -> list[float]:
    """The engine's ``ascore``: one score per document, in order (``instruction``: for the models that take one)."""
    if not documents:
        return []
    return list(await served.engine.ascore(query, documents, truncate=truncate, instruction=instruction))


def truncation(truncate: bool, *, left: bool = False) -> Truncate:
    """A request's truncation switch and side as the engine's ``truncate``: off refuses an over-long text."""
    if not truncate:
        return "error"
    return "start" if left else "end"


async def token_counts(served: Served, texts: list[str]) -> list[int]:
    """The tokens of each text as the model's tokenizer counts them (special tokens included), for usage."""
    tokenizer = getattr(served.engine, "tokenizer", None)
    if tokenizer is None or not texts:
        return [0] * len(texts)
    ids = await asyncio.to_thread(tokenizer.hf, texts, add_special_tokens=True)
    return [len(row) for row in ids["input_ids"]]


def base64_float32(row: np.ndarray) -> str:
    """A vector as the base64 of its little-endian float32 bytes (OpenAI's and Cohere's ``base64``)."""
    return base64.b64encode(np.asarray(row, dtype="<f4").tobytes()).decode()


def float_rows(vectors: Any) -> list[list[float]]:
    rows: list[list[float]] = np.asarray(vectors, dtype=np.float32).tolist()
    return rows
