"""The engine options, validated once, and what they resolve to: the model snapshot to read, and the bundled
backend's target on the resolved device.

Imports: models (families, source); pydantic.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rbln_retrieval.models.families import FamilyName
from rbln_retrieval.models.source import ModelSource, resolve_model

Device = Literal["auto", "rbln", "cpu"]
# host: the bundled runner's graphs on this CPU; rbln: compiled by the RBLN compiler for an NPU.
Target = Literal["host", "rbln"]


class EngineOptions(BaseModel):
    """Everything that changes an engine's computation; equal options share one engine. Per-call behaviour
    (truncation, timeouts, batch sizes, progress) is an argument of each call instead, and where the files come
    from (revision, cache_folder, token, local_files_only) is named by the resolved snapshot directory (see
    rbln_retrieval.models.source)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Device = "auto"
    runner: Literal["bundled", "stock"] = "bundled"
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    max_length: int | None = Field(default=None, gt=0)
    family: FamilyName | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    strict_shapes: bool = False
    # True: vLLM's engine runs in this process (rbln_retrieval.local.inproc): no engine processes to spawn, each
    # re-importing vLLM and torch, and no inter-process hop per step. False: vLLM's AsyncLLM with its processes.
    in_process: bool = True
    engine_kwargs: dict[str, Any] = Field(default_factory=dict)

    def target(self, device: str) -> Target | None:
        """The bundled backend's target on the resolved ``device``, or None for vLLM's stock CPU runner."""
        if self.runner == "stock":
            if device == "rbln":
                raise ValueError("runner='stock' is vLLM's CPU runner; device='rbln' needs runner='bundled'.")
            return None
        return "rbln" if device == "rbln" else "host"

    def resolve_source(self, model: str | os.PathLike[str] | ModelSource, **source_args: Any) -> ModelSource:
        """The snapshot directory for ``model``, fetching only the files these options let the engine read."""
        return resolve_model(
            model, allow_pickle=self.allow_pickle, trust_remote_code=self.trust_remote_code, **source_args
        )
