"""Prompted text -> token ids, with the caller's truncation policy applied before the engine sees anything.

We tokenize here rather than in vLLM so that truncation is defined for every input ("end" keeps the start,
"start" keeps the end, "error" names the offending index) and templates are never cut. The policy is an argument
of every call, so objects with different policies share one engine.

Imports: models (families), text (prompts); transformers when the first tokenizer is made.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.text.prompts import pair_template

# Truncation keeps at most max_length tokens: only a window of this many characters per kept token is tokenized,
# not the whole text (a 1 MB text would hold about 200 MiB of tokenizer state).
CHARS_PER_TOKEN = 32
# Where a window may be cut without splitting a word.
WHITESPACE = (" ", "\n", "\t", "\r", "\u3000")


@dataclass(frozen=True)
class Tokens:
    ids: list[int]
    # Segment ids for BERT-style pair inputs; None where the model takes none.
    type_ids: list[int] | None = None


class _OneCallAtATime:
    """A Hugging Face fast tokenizer whose calls take turns. Each call sets the Rust tokenizer's truncation and
    padding before encoding; a call that changes them while another thread's call encodes fails inside the Rust
    tokenizer ("Already borrowed"), so concurrent requests with different truncation would get errors."""

    def __init__(self, hf: Any):
        self._hf = hf
        self._lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._hf(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._hf, name)
        if not callable(value):
            return value

        def in_turn(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)

        return in_turn

    def __len__(self) -> int:
        return len(self._hf)


class PromptTokenizer:
    def __init__(self, model_dir: str | Path, family: ModelFamily, *, trust_remote_code: bool = False):
        self.family = family
        self.max_length = family.tokens.max_length
        self._model_dir = str(model_dir)
        self._trust_remote_code = trust_remote_code
        # The truncation side is tokenizer state, and calls with either side may run at once on worker threads:
        # one tokenizer per side, the left one loaded when a truncate="start" call first needs it. Truncation on or
        # off and its length are state too, set by each call: each side's calls take turns (_OneCallAtATime).
        self._by_side: dict[str, Any] = {}
        self._load_lock = threading.Lock()
        self.hf = self._side("right")
        self._num_special = len(self.hf("", add_special_tokens=True)["input_ids"])

    def _side(self, side: str) -> Any:
        with self._load_lock:
            if side not in self._by_side:
                from transformers import AutoTokenizer  # imported with the first local engine, not with the package

                hf: Any = AutoTokenizer.from_pretrained(
                    self._model_dir, trust_remote_code=self._trust_remote_code, truncation_side=side
                )
                # We enforce max_length ourselves; the tokenizer's own limit only warns on untruncated passes.
                hf.model_max_length = 1 << 62
                if self.family.prompt.prompt_holds_special_tokens:
                    hf.add_bos_token = hf.add_eos_token = False
                self._by_side[side] = _OneCallAtATime(hf)
            return self._by_side[side]

    def _for(self, truncate: str) -> Any:
        return self._side("left" if truncate == "start" else "right")

    # -- single texts (embeddings) ---------------------------------------------------------------------------
    def encode_texts(
        self, texts: list[str], prefix: str, truncate: str = "end", *, first_index: int = 0
    ) -> list[Tokens]:
        hf = self._for(truncate)
        if truncate == "error":
            ids = hf([prefix + text for text in texts], truncation=False)["input_ids"]
            for pos, row in enumerate(ids):
                if len(row) > self.max_length:
                    self._raise_too_long(first_index + pos, len(row))
            return self._text_tokens(ids)
        windows = [self._window(text, truncate) for text in texts]
        if truncate == "end":
            ids = hf([prefix + w for w, _ in windows], truncation=True, max_length=self.max_length)["input_ids"]
        else:
            ids = hf([prefix + w for w, _ in windows], truncation=False)["input_ids"]
        for pos, row in enumerate(ids):
            window, at_space = windows[pos]
            if len(row) < self.max_length and at_space:
                # The window held fewer tokens than fit (over CHARS_PER_TOKEN characters each): use the whole text.
                window = texts[pos]
                row = ids[pos] = hf(prefix + window, truncation=truncate == "end", max_length=self.max_length)[
                    "input_ids"
                ]
            if len(row) > self.max_length:  # truncate="start"
                ids[pos] = self._keep_end(hf, prefix, window)
        return self._text_tokens(ids)

    def cut_ids(self, rows: list[list[int]], truncate: str, what: str = "input") -> list[Tokens]:
        """Token ids as given, each over max_length cut as ``truncate`` says ("end" keeps the start, "start" the
        end; "error" refuses it naming its index)."""
        cut = []
        for pos, row in enumerate(rows):
            if len(row) > self.max_length:
                if truncate == "error":
                    self._raise_too_long(pos, len(row), what=what)
                row = row[: self.max_length] if truncate == "end" else row[-self.max_length :]
            cut.append(Tokens(list(row)))
        return cut

    def _text_tokens(self, ids: list[list[int]]) -> list[Tokens]:
        if self.family.prompt.text_suffix:  # after truncation, which never cuts it (the family's query suffix)
            suffix = self.hf(self.family.prompt.text_suffix, add_special_tokens=False)["input_ids"]
            ids = [row + suffix for row in ids]
        # The family pools the last position of a text padded to its length.
        if self.family.tokens.pad_text_to_max_length:
            pad = self.hf.pad_token_id
            return [Tokens(row + [pad] * (self.max_length - len(row))) for row in ids]
        return [Tokens(i) for i in ids]

    def _window(self, text: str, truncate: str) -> tuple[str, bool]:
        """The part of ``text`` that truncation can keep, and whether it was cut at whitespace: its start ("end") or
        its end ("start"), max_length x CHARS_PER_TOKEN characters cut at whitespace so no word is split, or cut
        right there when the window's outer half has no whitespace (a run that long is one huge word, or text
        without spaces: tokenizing all of it would cost its whole length for at most max_length tokens); ``text``
        itself when it is short."""
        limit = self.max_length * CHARS_PER_TOKEN
        if len(text) <= limit:
            return text, False
        if truncate == "end":
            cut = max(text.rfind(space, limit // 2, limit) for space in WHITESPACE)
            return (text[:cut], True) if cut > 0 else (text[:limit], False)
        start = len(text) - limit
        found = [at for at in (text.find(space, start, start + limit // 2) for space in WHITESPACE) if at >= 0]
        return (text[min(found) :], True) if found else (text[start:], False)

    def _keep_end(self, hf: Any, prefix: str, text: str) -> list[int]:
        """Keep the prompt and as much of the end of ``text`` as fits."""
        prefix_len = len(hf(prefix, add_special_tokens=False)["input_ids"]) if prefix else 0
        budget = self.max_length - self._num_special - prefix_len
        if budget <= 0:
            raise ValueError(f"The prompt {prefix!r} alone does not fit in max_length={self.max_length}.")
        offsets = hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        for keep in range(budget, 0, -1):  # re-tokenizing at a cut can merge pieces differently: shrink until it fits
            ids: list[int] = hf(prefix + text[offsets[-keep][0] :])["input_ids"]
            if len(ids) <= self.max_length:
                return ids
        prompt_only: list[int] = hf(prefix)["input_ids"]
        return prompt_only

    # -- pairs (cross-encoders) ------------------------------------------------------------------------------
    def encode_pairs(
        self, query: str, documents: list[str], truncate: str = "end", *, first_index: int = 0
    ) -> list[Tokens]:
        queries = [query] * len(documents)
        truncation = truncate != "error"
        enc = self._for(truncate)(
            queries,
            documents,
            truncation="longest_first" if truncation else False,
            max_length=self.max_length if truncation else None,
            return_token_type_ids=self.family.tokens.uses_token_type_ids,
        )
        if not truncation:
            for pos, row in enumerate(enc["input_ids"]):
                if len(row) > self.max_length:
                    self._raise_too_long(first_index + pos, len(row), what="documents", pair=True)
        type_ids = enc.get("token_type_ids") if self.family.tokens.uses_token_type_ids else None
        return [Tokens(ids, type_ids[pos] if type_ids else None) for pos, ids in enumerate(enc["input_ids"])]

    def encode_template(self, pairs: list[str], truncate: str = "end", *, first_index: int = 0) -> list[Tokens]:
        """A template reranker's recipe: the family template's fixed prefix and suffix tokens
        around each truncated pair text (rbln_retrieval.text.prompts.template_pairs)."""
        hf = self._for(truncate)
        template = pair_template(self.family)
        prefix = hf(template.prefix, add_special_tokens=False)["input_ids"]
        suffix = hf(template.suffix, add_special_tokens=False)["input_ids"]
        budget = self.max_length - len(prefix) - len(suffix)
        truncation = truncate != "error"
        middles = hf(pairs, add_special_tokens=False, truncation=truncation, max_length=budget if truncation else None)[
            "input_ids"
        ]
        out = []
        for pos, middle in enumerate(middles):
            if len(middle) > budget:
                self._raise_too_long(first_index + pos, len(prefix) + len(middle) + len(suffix), "documents", True)
            out.append(Tokens(prefix + middle + suffix))
        return out

    def _raise_too_long(self, index: int, count: int, what: str = "texts", pair: bool = False) -> None:
        subject = f"query + {what}[{index}]" if pair else f"{what}[{index}]"
        raise ValueError(
            f"{subject} is {count} tokens, over max_length={self.max_length} (truncate='error'; "
            "use truncate='end' or 'start' to cut it)."
        )
