"""Long texts, opt-in (``truncate="chunk"`` or ``Chunk(overlap=..., output=...)``): windows instead of a cut.

A text that fits is one window spanning it, embedded or scored exactly as without chunking. An over-long text is cut
into windows over the model's tokens: each holds as many of the text's tokens as fit beside what every input of the
call carries (the prompt and special tokens; for a reranker the query and the pair's template), the next starting
``overlap`` tokens before the previous one ends. A window is a character span of the text (from the tokenizer's
offsets), read as a whole model input (prompt, special tokens, query), so local and remote engines read the same
windows and a caller can repeat the computation on ``text[start:end]`` by hand.

This module plans windows only (input -> character spans and their token counts) and calls no engine: the windows
are pooled through the engine by rbln_retrieval.engines.windows and combined by rbln_retrieval.results.windows
(``embed``: the mean of the window vectors weighted by each window's text tokens, as vLLM's chunked processing
weighs them, normalized again when the call normalizes, or every window's vector with its span;
``score``/``rerank``: a document's best window's score).

Imports: models (families, spec), text (inputs, prompts, tokens).
"""

from __future__ import annotations

from collections.abc import Callable

from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.text.inputs import Chunk
from rbln_retrieval.text.prompts import embed_prefix, pair_template, score_method, template_pairs
from rbln_retrieval.text.tokens import PromptTokenizer

Span = tuple[int, int]
Plan = tuple[list[Span], list[int]]  # one text's windows: character spans and the text tokens each holds
PROBE = "a"


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

    def spans(self, texts: list[str], what: str = "texts", first: int = 0) -> list[Plan]:
        """(character spans, text tokens per window) for each text; a text that fits is the one span (0, len).
        ``what[first]`` names ``texts[0]`` in errors."""
        return [
            ([(0, len(text))], [length - self.overhead])
            if length <= self.max_length
            else self._cut(text, f"{what}[{first + i}]")
            for i, (text, length) in enumerate(zip(texts, self.lengths(texts)))
        ]

    def _cut(self, text: str, name: str) -> Plan:
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
    windows; a cross-encoder, the (query, window) pair; a template reranker, its template around the pair."""
    family, hf = tokenizer.family, tokenizer.hf
    method = score_method(family, model, instruction)
    if method.embeds:
        return embed_windows(tokenizer, embed_prefix(family, model, "document", None), chunk)
    if family.spec.pair_template is None:

        def pairs(docs: list[str]) -> list[int]:
            return [len(ids) for ids in hf([query] * len(docs), docs)["input_ids"]]

        return Windows(tokenizer, pairs, chunk.overlap, "query and special tokens")
    # As rbln_retrieval.text.tokens assembles it: the fixed prefix and suffix tokens around the tokenized pair text.
    template = pair_template(family)
    fixed = sum(len(hf(part, add_special_tokens=False)["input_ids"]) for part in (template.prefix, template.suffix))

    def templated(docs: list[str]) -> list[int]:
        texts = template_pairs(family, query, docs, instruction)
        return [fixed + len(ids) for ids in hf(texts, add_special_tokens=False)["input_ids"]]

    return Windows(tokenizer, templated, chunk.overlap, "query, instruction and the reranker's template")


def check_dense_only(output: object, family: ModelFamily) -> None:
    """Windows combine dense vectors and scores: refuse a token-level ``output`` (or a model that gives only those)."""
    if not (isinstance(output, str) and output == "dense") or family.late_interaction_only:
        late = " (its model gives token vectors only)" if family.late_interaction_only else ""
        raise ValueError(
            f"truncate='chunk' combines dense vectors and scores; output={output!r}{late} takes truncate 'end', "
            "'start' or 'error'."
        )
