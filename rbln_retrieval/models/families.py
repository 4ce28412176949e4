"""Model families: read a model directory and decide how it embeds or scores.

Everything is read from the directory (``config.json`` plus the sentence-transformers files ``modules.json``,
``1_Pooling/config.json``, ``config_sentence_transformers.json``, ``sentence_bert_config.json``); the model's own
prompts and pooling win over our defaults. Which family a directory is, and its preset, are the family specs'
(models/specs/): ``detect_family`` asks them in order. A ModelFamily is one directory's preset; its ``spec`` is what
the rest of the package asks about the family.

Imports: errors, models (spec, specs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import Pooling, read_json
from rbln_retrieval.models.spec import Checkpoint, FamilySpec
from rbln_retrieval.models.specs import DEFAULT_SPEC, SPECS, FamilyName, family_name, spec_named
from rbln_retrieval.models.specs.image_text import refusal

__all__ = ["FamilyName", "ModelFamily", "check_remote_code", "detect_family"]


@dataclass(frozen=True)
class ModelFamily:
    """How one model directory is turned into vectors or scores."""

    name: FamilyName
    architecture: str
    hidden_size: int  # the width of the vectors it returns (after any sentence-transformers Dense projection)
    max_length: int
    pooling: Pooling | None = None  # bi-encoders only
    normalize: bool = True  # the checkpoint's modules end in Normalize; embed's ``normalize=`` decides what callers get
    query_prompt: str = ""  # literal prefix for queries (a family with a query template: the template, formatted)
    document_prompt: str = ""
    default_instruction: str | None = None  # the task description an instruction-taking family uses by default
    matryoshka: bool = False
    matryoshka_dimensions: tuple[int, ...] = ()  # the only sizes ``dimensions`` may take; empty: any up to the width
    uses_token_type_ids: bool = False
    gated_mlp: bool = True  # its MLP has gate, up and down matrices (the NPU step's cost per token)
    kv_bytes_per_token: int = 0  # causal models only: KV cache per token at fp32, for sizing the cache
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    config_code: str | None = None  # auto_map reference of a config class shipped as code (needs trust_remote_code)
    image_size: int = 0  # image-text models (models/specs/image_text.py): the vision tower's square input; 0: none
    pad_text_to_max_length: bool = False  # the family pools the last position of a text padded to max_length
    text_suffix: str = ""  # put after each text's tokens once truncated (a query augmentation the family reads)
    # The prompts hold every special token (a leading <bos>): the tokenizer adds none, as the family's processor does.
    prompt_holds_special_tokens: bool = False
    image_prompt: str | None = None  # the text an image's prompt holds (a page prompt); None: no text

    def __post_init__(self) -> None:
        # A family rebuilt from a server's JSON description gets a list; equal families must compare equal.
        object.__setattr__(self, "matryoshka_dimensions", tuple(self.matryoshka_dimensions))

    @property
    def spec(self) -> FamilySpec:
        """What the package asks about this family (models/specs/)."""
        return spec_named(self.name)

    @property
    def is_cross_encoder(self) -> bool:
        return self.spec.is_cross_encoder

    @property
    def pooling_task(self) -> Literal["embed", "classify"]:
        return self.spec.pooling_task

    @property
    def gives_dense(self) -> bool:
        """Whether it has a pooled dense vector (a late-interaction family gives token vectors only, a sparse
        family one sparse vector)."""
        return "dense" in self.spec.outputs

    @property
    def embeds_images(self) -> bool:
        """Images and texts embed into one space (the image-text families of models/specs/)."""
        return self.image_size > 0

    @property
    def late_interaction_only(self) -> bool:
        """Token vectors are this family's only output: it scores by MaxSim and has no pooled vector."""
        return self.spec.outputs == ("multi_vector",)


def detect_family(model_dir: str | Path, *, max_length: int | None = None, family: str | None = None) -> ModelFamily:
    """Read ``model_dir`` and return its preset, or raise ModelNotSupportedError naming what is missing. ``family``
    names the text family to read it as instead of detecting one."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelNotSupportedError(f"Model directory {str(model_dir)!r} does not exist.")
    config = read_json(model_dir / "config.json")
    if not isinstance(config, dict):
        raise ModelNotSupportedError(f"{model_dir} has no config.json; is it a Hugging Face model directory?")
    ckpt = Checkpoint(model_dir, config, max_length)
    if refused := refusal(model_dir, ckpt.arch):
        raise refused
    spec = next((s for s in SPECS if s.images and s.claims(ckpt)), None) or _text_spec(ckpt, family)
    return ModelFamily(name=family_name(spec), **spec.preset(ckpt))


def _text_spec(ckpt: Checkpoint, family: str | None) -> FamilySpec:
    if family:
        named = spec_named(family)
        return DEFAULT_SPEC if named.images else named
    if spec := next((s for s in SPECS if not s.images and s.claims(ckpt)), None):
        return spec
    supported = sorted(set().union(*(s.architectures for s in SPECS)))
    raise ModelNotSupportedError(
        f"{ckpt.path} has architecture {ckpt.arch or 'none'!r}, which rbln-retrieval does not support "
        f"(supported: {', '.join(supported)})."
    )


def check_remote_code(model_dir: str | Path, family: ModelFamily, *, trust_remote_code: bool) -> None:
    """Refuse, in one sentence, a family whose config class is code shipped with the model unless the caller trusts
    it, or whose code file is missing from the model directory."""
    if family.config_code is None:
        return
    if not trust_remote_code:
        raise ModelNotSupportedError(
            f"{model_dir} is a {family.architecture} checkpoint ({family.name}) whose config class is code shipped "
            f"with the model ({family.config_code}); pass trust_remote_code=True if you trust its source."
        )
    module = family.config_code.partition(".")[0]
    if "--" not in family.config_code and not (Path(model_dir) / f"{module}.py").is_file():
        raise ModelNotSupportedError(
            f"{model_dir} names its config class {family.config_code}, but {module}.py is not in the directory."
        )
