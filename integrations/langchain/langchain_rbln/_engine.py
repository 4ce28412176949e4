"""Fields and engine lookup shared by RBLNEmbeddings and RBLNReranker."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal, TypeVar

from langchain_core.utils import secret_from_env
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator
from typing_extensions import Self

from rbln_retrieval import get_engine

T = TypeVar("T")

# Texts (or documents) per engine call. The engine submits all of them to vLLM at once and its scheduler packs
# them into steps, so this mainly bounds how long one call holds the engine before concurrent callers' requests
# interleave, and how often the progress bar moves; a bigger value rarely makes anything faster.
DEFAULT_BATCH_SIZE = 1024


class RBLNEngineModel(BaseModel):
    """Engine and remote-server settings; every object with equal settings shares one engine."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, validate_assignment=True)

    model: str = Field(alias="model_name")
    """Hugging Face model id (`org/name`, or `org/name@revision`) resolved through the Hugging Face cache, or a
    local model directory; with `base_url`, the model's name on the server."""

    revision: str | None = None
    """Branch, tag or commit of a Hugging Face id (default: `main`)."""

    cache_folder: str | None = None
    """Hugging Face cache to resolve ids in and download to (default: `HF_HUB_CACHE`, under `HF_HOME`)."""

    hf_token: SecretStr | None = None
    """Hugging Face token for gated or private models; None uses huggingface_hub's own (`HF_TOKEN`, or
    `hf auth login`). Never logged or shown."""

    device: Literal["auto", "rbln", "cpu"] = "auto"
    """Where the model runs: `rbln` (an RBLN NPU), `cpu`, or `auto` (an NPU when one is present)."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Weight and activation type; `auto` follows the checkpoint."""

    max_length: int | None = Field(default=None, gt=0)
    """Token limit per input (per query-document pair for rerankers); None uses the model's own limit."""

    truncate: Literal["end", "start", "error"] = "end"
    """What happens to inputs over `max_length`: cut at the end, cut at the start, or raise an error."""

    engine_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra vLLM engine arguments (`vllm.AsyncEngineArgs` names), e.g. `{"max_num_seqs": 64}`."""

    base_url: str | list[str] | None = None
    """URL of an `rbln-retrieval serve` server (or a list of replicas); None runs the model in this process."""

    api_key: SecretStr | None = Field(default_factory=secret_from_env("RBLN_API_KEY", default=None))
    """Server API key; read from the `RBLN_API_KEY` environment variable when not given."""

    timeout: float | None = Field(default=None, gt=0)
    """Seconds to wait for the server per request (remote mode only)."""

    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1)
    """Most inputs sent to the engine in one call. The engine batches on its own (vLLM's scheduler packs
    requests into steps), so this bounds how long one call holds the engine before other callers' requests
    interleave and how often progress is reported; it is not a tuning knob for speed."""

    _engine: Any = PrivateAttr(default=None)

    @field_validator("model", mode="before")
    @classmethod
    def _model_path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @model_validator(mode="after")
    def validate_environment(self) -> Self:
        """Attach the shared engine for these settings (started on first use, reused afterwards)."""
        self._engine = get_engine(
            self.model,
            revision=self.revision,
            cache_folder=self.cache_folder,
            token=self.hf_token.get_secret_value() if self.hf_token is not None else None,
            base_url=self.base_url,
            api_key=self.api_key.get_secret_value() if self.api_key is not None else None,
            timeout=self.timeout,
            device=self.device,
            dtype=self.dtype,
            max_length=self.max_length,
            truncate=self.truncate,
            engine_kwargs=self.engine_kwargs,
        )
        if self.base_url is None:
            self._check_local_engine(self._engine)
        return self

    def _check_local_engine(self, engine: Any) -> None:
        """Raise ValueError when this model cannot serve the subclass (checked where the family is known)."""

    @property
    def engine(self) -> Any:
        """The shared `rbln_retrieval` engine (or remote client) behind this object."""
        return self._engine


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
