"""Model families: read a model directory and decide how it embeds or scores.

Everything is read from the directory (``config.json`` plus the sentence-transformers files ``modules.json``,
``1_Pooling/config.json``, ``config_sentence_transformers.json``, ``sentence_bert_config.json``); the model's own
prompts and pooling win over our defaults. Which family a directory is, and its preset, are the family specs'
(models/specs/): ``detect_family`` asks them in order. A ModelFamily is one directory's preset; its ``spec`` is what
the rest of the package asks about the family.

Imports: errors, models (files, spec, specs, stages).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import read_json
from rbln_retrieval.models.spec import Checkpoint, FamilySpec
from rbln_retrieval.models.specs import DEFAULT_SPEC, SPECS, FamilyName, family_name, spec_named
from rbln_retrieval.models.specs.image_text import refusal
from rbln_retrieval.models.stages import (
    STAGE_OF,
    STAGES,
    GraphStage,
    OutputStage,
    PoolStage,
    PromptStage,
    TokenStage,
    sort_fields,
)

__all__ = ["FamilyName", "ModelFamily", "check_remote_code", "detect_family"]


@dataclass(frozen=True)
class ModelFamily:
    """How one model directory is turned into vectors or scores: its family's name and its stages, in data-path
    order (models/stages.py)."""

    name: FamilyName
    prompt: PromptStage
    tokens: TokenStage
    graph: GraphStage
    pool: PoolStage
    output: OutputStage

    @classmethod
    def build(cls, name: FamilyName, **fields: Any) -> ModelFamily:
        """The family ``name`` of a flat preset or description (each field lands in the stage that holds it)."""
        stages = sort_fields(fields)
        return cls(name, **{stage: STAGES[stage](**stages[stage]) for stage in STAGES})

    @property
    def stages(self) -> tuple[PromptStage, TokenStage, GraphStage, PoolStage, OutputStage]:
        return (self.prompt, self.tokens, self.graph, self.pool, self.output)

    def fields(self) -> dict[str, Any]:
        """Every field of every stage, flat (what a server's description carries; ``build`` reads it back)."""
        return {"name": self.name} | {k: v for stage in self.stages for k, v in dataclasses.asdict(stage).items()}

    if not TYPE_CHECKING:  # the package reads the stages; mypy must not accept a flat read

        def __getattr__(self, name: str) -> Any:
            """A field read flat (``family.hidden_size``), as before the stages: the stage's value, with a
            DeprecationWarning naming where it lives now (kept for one release)."""
            stage = STAGE_OF.get(name)
            if stage is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            warnings.warn(
                f"ModelFamily.{name} is deprecated; read family.{stage}.{name} (a family is its stages).",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(object.__getattribute__(self, stage), name)

    def replace(self, **fields: Any) -> ModelFamily:
        """This family with ``fields`` (flat, as ``build`` takes them) changed in the stages that hold them."""
        changed = sort_fields(fields)
        stages = {stage: dataclasses.replace(getattr(self, stage), **changed[stage]) for stage in STAGES}
        return ModelFamily(self.name, **stages)

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
        return self.graph.image_size > 0

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
    return ModelFamily.build(family_name(spec), **spec.preset(ckpt))


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
    if family.graph.config_code is None:
        return
    if not trust_remote_code:
        raise ModelNotSupportedError(
            f"{model_dir} is a {family.graph.architecture} checkpoint ({family.name}) whose config class is code "
            f"shipped with the model ({family.graph.config_code}); pass trust_remote_code=True if you trust its source."
        )
    module = family.graph.config_code.partition(".")[0]
    if "--" not in family.graph.config_code and not (Path(model_dir) / f"{module}.py").is_file():
        raise ModelNotSupportedError(
            f"{model_dir} names its config class {family.graph.config_code}, but {module}.py is not in the directory."
        )
