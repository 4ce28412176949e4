"""The engine options, each declared once (type, default, help), validated once, and what they resolve to: the model
snapshot to read, and the bundled backend's target on the resolved device. ``local_model`` is a local engine's
front door: every entry point (``get_engine``, ``PoolingEngine``, ``serve``) builds its ``EngineOptions`` once,
resolves the snapshot and reads its family once, and hands the typed ``LocalModel`` down to the engine.

Imports: models (families, files, source); pydantic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rbln_retrieval.models.families import FamilyName, ModelFamily, check_remote_code, detect_family
from rbln_retrieval.models.files import check_weights
from rbln_retrieval.models.source import ModelSource, resolve_model

Device = Literal["auto", "rbln", "cpu"]
DType = Literal["auto", "float32", "bfloat16"]
Runner = Literal["bundled", "stock"]
# host: the bundled runner's graphs on this CPU; rbln: compiled by the RBLN compiler for an NPU.
Target = Literal["host", "rbln"]


class SourceOptions(BaseModel):
    """Where a model's files come from, as every entry point names them (the framework objects' fields, the CLI's
    flags); ``PoolingEngine`` takes the same names as keyword arguments (rbln_retrieval.models.source)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    revision: str | None = None
    """Branch, tag or commit of a Hugging Face id (default: `main`)."""

    cache_folder: str | None = None
    """Hugging Face cache to resolve ids in and download to (default: `HF_HUB_CACHE`, under `HF_HOME`)."""


class ComputeOptions(BaseModel):
    """How a model runs, as a user chooses it: each option declared once here with its type, default and help (its
    docstring). ``EngineOptions`` adds the options only the core takes; the framework objects' settings
    (rbln_retrieval.frameworks.settings) inherit these fields, the CLI's flags are made from them (rbln_retrieval.cli)
    and the options table of docs/getting-started.md is held to them (tests/engine/test_options.py)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    device: Device = "auto"
    """Where the model runs: `rbln` (an RBLN NPU), `cpu`, or `auto` (an NPU when one is present)."""

    dtype: DType = "auto"
    """Compute type on the CPU: `auto` is bfloat16 matmuls (pooling and normalization in float32) on CPUs with
    native BF16 (AVX512_BF16 or AMX) and float32 otherwise, whatever the checkpoint's own dtype."""

    max_length: int | None = Field(default=None, gt=0)
    """Token limit per input (per query-document pair for rerankers); unset: the model's own limit."""

    family: FamilyName | None = None
    """The model family; None reads it from the model directory (or, remote, from the server's description)."""

    trust_remote_code: bool = False
    """Run code shipped with the model (tokenizer or model classes); off unless you trust the source."""

    allow_pickle: bool = False
    """Load pickle weights (`*.bin`); off: only safetensors are loaded, as pickle can run code."""

    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra vLLM engine arguments (`vllm.AsyncEngineArgs` names), e.g. `{"max_num_seqs": 64}`."""


class EngineOptions(ComputeOptions):
    """Everything that changes an engine's computation; equal options share one engine. Per-call behaviour
    (truncation, timeouts, batch sizes, progress) is an argument of each call instead, and where the files come
    from (revision, cache_folder, token, local_files_only) is named by the resolved snapshot directory (see
    rbln_retrieval.models.source)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runner: Runner = "bundled"
    """The bundled backend (`bundled`) or vLLM's stock CPU runner (`stock`)."""

    strict_shapes: bool = False
    """Trace every bucket graph through torch.compile on the host too, record it and refuse a compile after warmup,
    as the NPU's static graphs would."""

    in_process: bool = True
    """Run vLLM's engine in this process (no engine processes to spawn, each re-importing vLLM and torch, and no
    inter-process hop per step); False: vLLM's AsyncLLM with its own engine processes, which keep a crashing engine
    out of your process."""

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


@dataclass(frozen=True)
class LocalModel:
    """A local engine's model as its entry point resolved it: the snapshot directory, the engine options and the
    family read from the snapshot, each made once and handed down (to a holder process too: it pickles)."""

    source: ModelSource
    options: EngineOptions
    family: ModelFamily

    @property
    def path(self) -> str:
        return self.source.path

    def __str__(self) -> str:
        return str(self.source)


def local_model(model: str | os.PathLike[str] | ModelSource, options: EngineOptions, **source_args: Any) -> LocalModel:
    """``model`` resolved for a local engine of ``options``: its snapshot, and its family read and checked (remote
    code, pickle weights) before any engine starts."""
    source = options.resolve_source(model, **source_args)
    family = detect_family(source.path, max_length=options.max_length, family=options.family)
    check_remote_code(source.path, family, trust_remote_code=options.trust_remote_code)
    check_weights(source.path, allow_pickle=options.allow_pickle)
    return LocalModel(source, options, family)
