"""A model family's stages: what one model directory does at each step of the data path, in its order (input ->
prompt -> tokens -> graph -> pool -> output), as a sentence-transformers model is a list of its modules. Each stage
holds only what that step reads; a ModelFamily (models/families.py) is its name and these five.

A family's spec (models/specs/) fills them from a checkpoint as one flat preset (field names are unique across the
stages), which ``STAGE_OF`` sorts into stages; the same flat form is what a server's description carries.

Imports: models (files).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from rbln_retrieval.models.files import Pooling


@dataclass(frozen=True)
class PromptStage:
    """Input -> prompt: the text put around each query and document before tokenization."""

    query_prompt: str = ""  # literal prefix for queries (a family with a query template: the template, formatted)
    document_prompt: str = ""
    default_instruction: str | None = None  # the task description an instruction-taking family uses by default
    text_suffix: str = ""  # put after each text's tokens once truncated (a query augmentation the family reads)
    # The prompts hold every special token (a leading <bos>): the tokenizer adds none, as the family's processor does.
    prompt_holds_special_tokens: bool = False
    image_prompt: str | None = None  # the text an image's prompt holds (a page prompt); None: no text


@dataclass(frozen=True)
class TokenStage:
    """Prompt -> tokens: how long a sequence may be and what the tokenizer hands the graph besides the ids."""

    max_length: int
    uses_token_type_ids: bool = False
    pad_text_to_max_length: bool = False  # the family pools the last position of a text padded to max_length


@dataclass(frozen=True)
class GraphStage:
    """Tokens -> hidden states: the transformer vLLM loads and runs, and what sizes its steps and cache."""

    architecture: str
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    config_code: str | None = None  # auto_map reference of a config class shipped as code (needs trust_remote_code)
    gated_mlp: bool = True  # its MLP has gate, up and down matrices (the NPU step's cost per token)
    kv_bytes_per_token: int = 0  # causal models only: KV cache per token at fp32, for sizing the cache
    image_size: int = 0  # image-text models (models/specs/image_text.py): the vision tower's square input; 0: none


@dataclass(frozen=True)
class PoolStage:
    """Hidden states -> one vector per text: the pooling and the width of what comes out."""

    hidden_size: int  # the width of the vectors it returns (after any sentence-transformers Dense projection)
    pooling: Pooling | None = None  # bi-encoders only


@dataclass(frozen=True)
class OutputStage:
    """Vector -> what callers get: normalization and the sizes a vector may be cut to."""

    normalize: bool = True  # the checkpoint's modules end in Normalize; embed's ``normalize=`` decides what callers get
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()  # the only sizes ``dimensions`` may take; empty: any up to the width

    def __post_init__(self) -> None:
        # A family rebuilt from a server's JSON description gets a list; equal families must compare equal.
        object.__setattr__(self, "matryoshka_dimensions", tuple(self.matryoshka_dimensions))


# The stages in data-path order, by the ModelFamily attribute that holds each.
STAGES: dict[str, type] = {
    "prompt": PromptStage,
    "tokens": TokenStage,
    "graph": GraphStage,
    "pool": PoolStage,
    "output": OutputStage,
}
# Which stage holds each field of a flat preset or description.
STAGE_OF = {f.name: stage for stage, cls in STAGES.items() for f in fields(cls)}


def sort_fields(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``flat`` (a preset or a description's fields) sorted by stage; a field no stage holds raises TypeError naming
    it, as a dataclass refuses an unexpected keyword."""
    unknown = sorted(set(flat) - set(STAGE_OF))
    if unknown:
        raise TypeError(f"no stage of a model family holds {', '.join(unknown)}")
    by_stage: dict[str, dict[str, Any]] = {stage: {} for stage in STAGES}
    for name, value in flat.items():
        by_stage[STAGE_OF[name]][name] = value
    return by_stage
