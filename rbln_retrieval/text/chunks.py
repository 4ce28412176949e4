"""Long texts, opt-in (``truncate="chunk"`` or ``Chunk(overlap=..., output=...)``): windows instead of a cut.

A text that fits is one window spanning it, embedded or scored exactly as without chunking. An over-long text is cut
into windows over the model's tokens: each holds as many of the text's tokens as fit beside what every input of the
call carries (the prompt and special tokens; for a reranker the query and the pair's template), the next starting
``overlap`` tokens before the previous one ends. A window is a character span of the text (from the tokenizer's
offsets), read as a whole model input (prompt, special tokens, query), so local and remote engines read the same
windows and a caller can repeat the computation on ``text[start:end]`` by hand.

Combining: ``embed`` gives the mean of the window vectors weighted by each window's text tokens (vLLM's chunked
processing weights by tokens too), normalized again when the call normalizes; ``Chunk(output="all")`` gives every
window's vector with its span instead. ``score``/``rerank`` give a document its best window's score.

Memory stays bounded: texts are taken CHUNK_SIZE at a time, and their windows are embedded or scored WINDOW_BATCH at
a time into running sums (per text, while the text's windows are held as spans, not strings).

Imports: models (families, family_prompts, spec), text (inputs, prompts, tokens); numpy.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.family_prompts import QWEN3_RERANKER_PREFIX, QWEN3_RERANKER_SUFFIX
from rbln_retrieval.models.spec import Scoring
from rbln_retrieval.text.inputs import CHUNK_SIZE, Chunk, chunks
from rbln_retrieval.text.prompts import embed_prefix, qwen3_reranker_pairs, score_method
from rbln_retrieval.text.tokens import PromptTokenizer

# Windows embedded or scored per engine call: the engine's own batching unit.
WINDOW_BATCH = CHUNK_SIZE

Span = tuple[int, int]
PROBE = "a"


@dataclass(frozen=True)
class ChunkedEmbedding:
    """One text's windows under ``Chunk(output="all")``: ``vectors`` float32 (windows, d) in text order, and each
    window's character ``spans`` (start, end) in the text and its count of the text's ``tokens`` (the weights of
    ``output="mean"``)."""

    vectors: np.ndarray
    spans: list[Span]
    tokens: list[int]


class Windows:
    """The windows of texts for one kind of model input; ``lengths`` gives each candidate text's whole input length
    (prompt, special tokens, query: nothing cut), ``around`` names what surrounds the text in it."""

    def __init__(
        self, tokenizer: PromptTokenizer, lengths: Callable[[list[str]], list[int]], overlap: int, around: str
    ):
        self.hf = tokenizer.hf
        self.family = tokenizer.family
        self.max_length = tokenizer.max_length
        if not self.max_length:
            raise ValueError(
                "truncate='chunk' cuts windows of the model's max_length, which is unknown; pass max_length=."
            )
        self.lengths = lengths
        self.overlap = overlap
        # What surrounds one token of text (an empty text would drop a pair's second segment and its separator).
        self.overhead = lengths([PROBE])[0] - len(self.hf(PROBE, add_special_tokens=False)["input_ids"])
        self.budget = self.max_length - self.overhead
        if self.budget < 1:
            raise ValueError(
                f"The {around} alone take {self.overhead} of max_length={self.max_length} tokens, leaving none for "
                "a window of text; shorten them or use truncate='end'."
            )
        if overlap >= self.budget:
            raise ValueError(
                f"Chunk overlap={overlap} must be below the {self.budget} tokens of text a window holds "
                f"(max_length={self.max_length} minus {self.overhead} for the {around})."
            )

    def spans(self, texts: list[str], what: str = "texts", first: int = 0) -> list[tuple[list[Span], list[int]]]:
        """(character spans, text tokens per window) for each text; a text that fits is the one span (0, len).
        ``what[first]`` names ``texts[0]`` in errors."""
        return [
            ([(0, len(text))], [length - self.overhead])
            if length <= self.max_length
            else self._cut(text, f"{what}[{first + i}]")
            for i, (text, length) in enumerate(zip(texts, self.lengths(texts)))
        ]

    def _cut(self, text: str, name: str) -> tuple[list[Span], list[int]]:
        offsets = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        budget = self.budget
        while True:
            bounds = []
            start = 0
            while True:
                end = min(start + budget, len(offsets))
                bounds.append((start, end))
                if end == len(offsets):
                    break
                start = end - self.overlap
            spans = [(offsets[a][0], offsets[b - 1][1]) for a, b in bounds]
            # A window re-tokenized on its own, next to the prompt, can take a few more tokens than it held inside
            # the whole text: shrink every window by the largest excess and cut again.
            excess = max(self.lengths([text[a:b] for a, b in spans])) - self.max_length
            if excess <= 0:
                return spans, [b - a for a, b in bounds]
            budget -= excess
            if budget <= self.overlap:
                raise ValueError(
                    f"{name} cannot be cut into windows of max_length={self.max_length} tokens overlapping by "
                    f"{self.overlap}: its pieces re-tokenize longer; use a smaller overlap."
                )


def embed_windows(tokenizer: PromptTokenizer, prefix: str, chunk: Chunk) -> Windows:
    """Windows for embedding texts after ``prefix`` (the family's prompt or an instruction)."""
    hf = tokenizer.hf

    def lengths(texts: list[str]) -> list[int]:
        return [len(ids) for ids in hf([prefix + t for t in texts])["input_ids"]]

    return Windows(
        tokenizer, lengths, chunk.overlap, f"prompt {prefix!r} and special tokens" if prefix else "special tokens"
    )


def score_windows(tokenizer: PromptTokenizer, model: str, query: str, instruction: str | None, chunk: Chunk) -> Windows:
    """Windows for scoring documents against ``query`` the way the family scores: cosine, the documents' embedding
    windows; a cross-encoder, the (query, window) pair; Qwen3-Reranker, its template around the pair."""
    family, hf = tokenizer.family, tokenizer.hf
    method = score_method(family, model, instruction)
    if method.embeds:
        return embed_windows(tokenizer, embed_prefix(family, model, "document", None), chunk)
    if method is Scoring.PAIRS:

        def pairs(docs: list[str]) -> list[int]:
            return [len(ids) for ids in hf([query] * len(docs), docs)["input_ids"]]

        return Windows(tokenizer, pairs, chunk.overlap, "query and special tokens")
    # As rbln_retrieval.text.tokens assembles it: the fixed prefix and suffix tokens around the tokenized pair text.
    fixed = sum(
        len(hf(part, add_special_tokens=False)["input_ids"]) for part in (QWEN3_RERANKER_PREFIX, QWEN3_RERANKER_SUFFIX)
    )

    def qwen3(docs: list[str]) -> list[int]:
        texts = qwen3_reranker_pairs(family, query, docs, instruction)
        return [fixed + len(ids) for ids in hf(texts, add_special_tokens=False)["input_ids"]]

    return Windows(tokenizer, qwen3, chunk.overlap, "query, instruction and Qwen3-Reranker template")


def _dense_only(output: Any, family: ModelFamily) -> None:
    if not (isinstance(output, str) and output == "dense") or family.late_interaction_only:
        late = " (its model gives token vectors only)" if family.late_interaction_only else ""
        raise ValueError(
            f"truncate='chunk' combines dense vectors and scores; output={output!r}{late} takes truncate 'end', "
            "'start' or 'error'."
        )


async def _stream(
    windows: Windows,
    texts: Iterable[str],
    what: str,
    run: Callable[[list[str]], Awaitable[Any]],
    plan: Callable[[int, list[tuple[list[Span], list[int]]]], None],
    take: Callable[[int, Any], None],
) -> None:
    """Plan each chunk of ``texts`` (``plan(index of its first text, plans)``, in a worker thread), then run ``run``
    over its windows WINDOW_BATCH at a time, handing each row in order to ``take(index of its text, row)``."""
    for first, chunk in chunks(texts, what):
        plans = await asyncio.to_thread(windows.spans, chunk, what, first)
        plan(first, plans)
        items = ((first + i, text[a:b]) for i, (text, (spans, _)) in enumerate(zip(chunk, plans)) for a, b in spans)
        while batch := list(itertools.islice(items, WINDOW_BATCH)):
            rows = await run([piece for _, piece in batch])
            for (index, _), row in zip(batch, rows):
                take(index, row)


async def embed_chunked(
    windows: Windows,
    texts: Iterable[str],
    chunk: Chunk,
    normalize: bool,
    embed: Callable[[list[str]], Awaitable[np.ndarray]],
    *,
    output: Any = "dense",
    what: str = "texts",
) -> np.ndarray | list[ChunkedEmbedding]:
    """One vector per text (``chunk.output == "mean"``) or one ChunkedEmbedding per text (``"all"``), in input
    order; ``embed`` embeds a list of window texts as the call embeds texts (an empty list: the empty result)."""
    _dense_only(output, windows.family)
    plans: dict[int, tuple[list[Span], list[int]]] = {}
    rows: list[np.ndarray] = []
    results: list[Any] = []

    def plan(first: int, chunk_plans: list[tuple[list[Span], list[int]]]) -> None:
        plans.update((first + i, p) for i, p in enumerate(chunk_plans))

    def take(index: int, row: Any) -> None:
        # Windows arrive in text order: a text's rows are complete when its last window arrives.
        rows.append(row)
        spans, tokens = plans[index]
        if len(rows) == len(spans):
            del plans[index]
            results.append(_combined(rows, spans, tokens, chunk, normalize))
            rows.clear()

    await _stream(windows, texts, what, embed, plan, take)
    if chunk.output == "all":
        return results
    if not results:
        return await embed([])
    return np.stack(results).astype(np.float32, copy=False)


def _combined(vectors: list[np.ndarray], spans: list[Span], tokens: list[int], chunk: Chunk, normalize: bool) -> Any:
    if chunk.output == "all":
        return ChunkedEmbedding(np.stack(vectors).astype(np.float32, copy=False), spans, tokens)
    if len(vectors) == 1:  # a text that fits: its vector as computed, not normalized again
        return vectors[0]
    weights = np.asarray(tokens, dtype=np.float64)
    mean = (np.stack(vectors).astype(np.float64) * weights[:, None]).sum(0) / weights.sum()
    if normalize:
        mean /= max(float(np.linalg.norm(mean)), 1e-12)
    return mean.astype(np.float32)


async def score_chunked(
    windows: Windows,
    documents: Iterable[str],
    chunk: Chunk,
    score: Callable[[list[str]], Awaitable[list[float]]],
    *,
    output: str = "dense",
) -> list[float]:
    """Each document's best window's score, in input order; ``score`` scores a list of window texts."""
    _dense_only(output, windows.family)
    if chunk.output != "mean":
        raise ValueError("Chunk(output='all') applies to embed; a document's score is its best window's.")
    best: list[float] = []

    def plan(first: int, chunk_plans: list[Any]) -> None:
        best.extend([-np.inf] * len(chunk_plans))

    def take(index: int, row: Any) -> None:
        best[index] = max(best[index], float(row))

    await _stream(windows, documents, "documents", score, plan, take)
    return best
