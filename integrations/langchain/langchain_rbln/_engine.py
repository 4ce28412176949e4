"""Fields and engine lookup shared by RBLNEmbeddings and RBLNReranker."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import ConfigDict, Field, PrivateAttr, field_validator

from rbln_retrieval import ModelFamily
from rbln_retrieval.frameworks.connect import EngineHandle
from rbln_retrieval.frameworks.settings import ENGINE_SETTINGS, EngineSettings

T = TypeVar("T")

# Texts (or documents) per engine call. The engine submits all of them to vLLM at once and its scheduler packs
# them into steps, so this mainly bounds how long one call holds the engine before concurrent callers' requests
# interleave, and how often the progress bar moves; a bigger value rarely makes anything faster.
DEFAULT_BATCH_SIZE = 1024


class RBLNEngineModel(EngineSettings):
    """Engine and remote-server settings (rbln_retrieval.frameworks.settings); every object with equal engine
    settings shares one engine."""

    _frozen_fields: ClassVar[frozenset[str]] = ENGINE_SETTINGS | {"model"}

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    model: str = Field(alias="model_name")
    """Hugging Face model id (`org/name`, or `org/name@revision`) resolved through the Hugging Face cache, or a
    local model directory; with `base_url`, the model's name on the server."""

    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1)
    """Most inputs sent to the engine in one call. The engine batches on its own (vLLM's scheduler packs
    requests into steps), so this bounds how long one call holds the engine before other callers' requests
    interleave and how often progress is reported; it is not a tuning knob for speed."""

    _engine: Any = PrivateAttr(default=None)

    def __init__(self, **data: Any):
        super().__init__(**data)
        # Outside pydantic's validation, so core errors (ModelNotSupportedError...) reach the caller unwrapped.
        handle = self._claim(self.model)
        family = handle.spec.family  # the resolved snapshot's, read once by get_engine; None for a remote model
        if family is not None:  # checked before an engine starts
            self._check_family(family)
        handle.engine  # noqa: B018 - start (or join) the engine now, so a bad model fails here
        self._engine = handle

    @field_validator("model", mode="before")
    @classmethod
    def _model_path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    def _check_family(self, family: ModelFamily) -> None:
        """Raise ValueError when this model cannot serve the subclass (checked before an engine starts)."""

    @property
    def engine(self) -> EngineHandle:
        """This object's claim on the shared `rbln_retrieval` engine (or remote client): the engine's API, and
        `close()` releases this object's claim only."""
        return self._engine


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
