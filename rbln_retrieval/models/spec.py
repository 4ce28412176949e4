"""What a model family is, as the rest of the package asks it: one frozen ``FamilySpec`` per family (its modules in
models/specs/), holding how a checkpoint of it is recognised and read into a ModelFamily, its prompts and templates,
the outputs it gives, how it scores, and what loading and the NPU need of it. No module outside models/specs/ names
a family; it asks the spec.

Imports: errors, models (files).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import Pooling, read_json, sentence_transformers_modules, st_pooling

Output = Literal["dense", "sparse", "multi_vector"]
OUTPUTS: tuple[Output, ...] = ("dense", "sparse", "multi_vector")
_ROBERTA_TYPES = {"roberta", "xlm-roberta"}
# Model types whose MLP is two matrices (up, down); every other architecture's is gated (gate, up, down).
_PLAIN_MLP_TYPES = {"bert", *_ROBERTA_TYPES}


@dataclass(frozen=True)
class Scoring:
    """How a family scores a query against documents, as data the scoring router reads (it names no mode): the
    engine embeds query and documents apart and compares one output of theirs (``compares``: dense vectors by their
    dot product, sparse vectors by theirs, token vectors by MaxSim with the spec's ``maxsim_reduction``), or, with
    ``compares=None``, the model reads each (query, document) pair: inside the family's ``pair_template`` when the
    spec has one (a template reranker), else as the tokenizer's two segments (a cross-encoder). A family that scores
    by another combination of these is one value in its spec."""

    compares: Output | None = "dense"
    takes_instruction: bool = True  # False: an instruction is refused (a cross-encoder has nowhere to put it)

    @property
    def embeds(self) -> bool:
        """Query and documents are embedded apart and compared (not read together by the model)."""
        return self.compares is not None


@dataclass(frozen=True)
class PairTemplate:
    """A reranker's prompt around a (query, document) pair, for a family whose Scoring reads pairs: the fixed prefix
    and suffix are never truncated. The scoring stage asks the family's template for its texts and knows no family."""

    prefix: str
    pair: str  # with {instruction}, {query} and {document}
    suffix: str

    def pairs(self, query: str, documents: list[str], instruction: str) -> list[str]:
        """The part of each document's prompt that truncation may cut."""
        return [self.pair.format(instruction=instruction, query=query, document=d) for d in documents]


class Checkpoint:
    """What detection reads of one model directory: config.json and the sentence-transformers files."""

    def __init__(self, path: Path, config: dict[str, Any], user_max_length: int | None) -> None:
        self.path = path
        self.config = config
        self.user_max_length = user_max_length
        architectures = config.get("architectures") or []
        self.arch: str = architectures[0] if architectures else ""

    @cached_property
    def modules(self) -> list[dict[str, Any]]:
        return sentence_transformers_modules(self.path)

    @cached_property
    def prompts(self) -> dict[str, str]:
        st_config = read_json(self.path / "config_sentence_transformers.json")
        return (st_config or {}).get("prompts") or {} if isinstance(st_config, dict) else {}

    @cached_property
    def pooling(self) -> Pooling | None:
        return st_pooling(self.path, self.modules)

    def query_prompt(self, default: str = "") -> str:
        return self.prompts.get("query", default)

    def document_prompt(self, default: str = "") -> str:
        return self.prompts.get("document", self.prompts.get("passage", default))

    @property
    def normalizes(self) -> bool:
        return any(m.get("type", "").endswith("Normalize") for m in self.modules)

    @property
    def uses_token_type_ids(self) -> bool:
        return bool(self.config.get("type_vocab_size", 0) > 1)

    def common(self) -> dict[str, Any]:
        """The ModelFamily fields every text family reads the same way."""
        return {
            "architecture": self.arch,
            # n_embd: GPT-2 style configs
            "hidden_size": int(self.config.get("hidden_size") or self.config.get("n_embd") or 0),
            "max_length": self._max_length(),
            "hf_overrides": self._config_fixes(),
            "gated_mlp": self.config.get("model_type") not in _PLAIN_MLP_TYPES,
        }

    def kv_bytes_per_token(self) -> int:
        """Causal models only: KV cache per token at fp32, for sizing the cache."""
        config = self.config
        heads = config.get("num_attention_heads", 1)
        head_dim = config.get("head_dim") or config.get("hidden_size", 0) // heads
        kv_heads = config.get("num_key_value_heads") or heads
        return int(2 * config.get("num_hidden_layers", 1) * kv_heads * head_dim * 4)

    def _max_length(self) -> int:
        config, limits = self.config, []
        # GPT-2 style configs name it n_positions; vLLM takes the smaller where both are given.
        positions = min((config[k] for k in ("max_position_embeddings", "n_positions") if config.get(k)), default=None)
        if positions:
            # RoBERTa-style models number positions from padding_idx + 1.
            offset = config.get("pad_token_id", 1) + 1 if config.get("model_type") in _ROBERTA_TYPES else 0
            limits.append(positions - offset)
        st_config = read_json(self.path / "sentence_bert_config.json")
        if isinstance(st_config, dict) and st_config.get("max_seq_length"):
            limits.append(int(st_config["max_seq_length"]))
        if not limits:
            raise ModelNotSupportedError(f"{self.path} declares no maximum sequence length (max_position_embeddings).")
        model_limit = min(limits)
        if self.user_max_length is None:
            return int(model_limit)
        if not 0 < self.user_max_length <= max(limits):
            raise ValueError(f"max_length={self.user_max_length} is outside 1..{max(limits)} for {self.path}.")
        return self.user_max_length

    def _config_fixes(self) -> dict[str, Any]:
        """hf_overrides that let vLLM 0.30 load configs written by transformers 5.x."""
        if self.config.get("model_type") in _ROBERTA_TYPES and "position_embedding_type" not in self.config:
            # transformers 5.x omits it; vLLM's RoBERTa code reads it.
            return {"position_embedding_type": "absolute"}
        return {}


@dataclass(frozen=True)
class FamilySpec:
    """One model family: everything the package does differently for it."""

    name: str  # as ModelFamily.name, options' ``family=`` and a server's description carry it
    architectures: frozenset[str]  # config.json architectures it runs (for the "supported" list)
    preset: Callable[[Checkpoint], dict[str, Any]]  # the checkpoint's ModelFamily fields (all but name)
    # Claims a checkpoint (may refuse one it recognises but cannot run); None: by its architecture alone.
    detect: Callable[[Checkpoint], bool] | None = None
    scoring: Scoring = Scoring()
    outputs: tuple[Output, ...] = ("dense",)
    maxsim_reduction: Literal["sum", "mean"] = "sum"  # how MaxSim combines the query vectors' best matches
    query_prompt: str = ""  # defaults when the model directory declares no prompts
    document_prompt: str = ""
    query_template: str | None = None  # how an instruction becomes the query prompt ({instruction}); None: verbatim
    default_instruction: str | None = None  # the task a model takes when the caller gives none
    pair_template: PairTemplate | None = None  # a pair-reading family's prompt around each pair
    matryoshka: bool = False
    vocabulary_row: bool = False  # the "embed" task's one vocabulary-sized row is its sparse vector
    # The bundled backend's vLLM architecture it runs as (one of backend/graph's), registered in every vLLM process
    # by the backend's general plugin; its hf_overrides name it.
    bundled_model: str | None = None
    loads_pickle_heads: bool = False  # heads shipped only as .pt state dicts (read by torch's weights-only unpickler)
    head_files: tuple[str, ...] = ()  # files of its heads beside the weights, fetched with a hub snapshot
    refuse_output: str | None = None  # sentence for an output it lacks: {model}, {output}, {missing} (the head)
    npu_note: str | None = None  # what the NPU runner does with its token-level outputs, when not the usual
    images: bool = False  # embeds images and texts into one space; claimed by architecture, never by ``family=``

    def __post_init__(self) -> None:
        compares = self.scoring.compares
        if compares is not None and compares not in self.outputs:
            raise ValueError(f"The {self.name} family compares {compares} outputs but gives only {self.outputs}.")
        if self.pair_template is not None and self.scoring.embeds:
            raise ValueError(f"The {self.name} family has a pair template but embeds; a template is read with pairs.")

    def claims(self, ckpt: Checkpoint) -> bool:
        """Whether this family runs ``ckpt``."""
        return self.detect(ckpt) if self.detect is not None else ckpt.arch in self.architectures

    @property
    def pooling_task(self) -> Literal["embed", "classify"]:
        return "embed" if self.scoring.embeds else "classify"

    @property
    def is_cross_encoder(self) -> bool:
        return not self.scoring.embeds
