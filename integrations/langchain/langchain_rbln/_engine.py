"""Fields and engine lookup shared by RBLNEmbeddings and RBLNReranker."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, Literal, TypeVar

from langchain_core.utils import secret_from_env
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator

from rbln_retrieval import EngineHolder, ModelFamily, detect_family, get_engine

T = TypeVar("T")

# Texts (or documents) per engine call. The engine submits all of them to vLLM at once and its scheduler packs
# them into steps, so this mainly bounds how long one call holds the engine before concurrent callers' requests
# interleave, and how often the progress bar moves; a bigger value rarely makes anything faster.
DEFAULT_BATCH_SIZE = 1024

# The fields that select the shared engine; every other field is read at each call, so assigning it takes effect.
ENGINE_FIELDS = frozenset(
    {"model", "revision", "cache_folder", "hf_token", "device", "dtype", "max_length", "family", "trust_remote_code",
     "allow_pickle", "engine_kwargs", "base_url", "api_key"}
)


class RBLNEngineModel(EngineHolder, BaseModel):
    """Engine and remote-server settings; every object with equal engine settings shares one engine."""

    _frozen_fields: ClassVar[frozenset[str]] = ENGINE_FIELDS

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
    """Compute type on the CPU: `auto` is bfloat16 matmuls (pooling and normalization in float32) on CPUs with
    native BF16 (AVX512_BF16 or AMX) and float32 otherwise, whatever the checkpoint's own dtype."""

    max_length: int | None = Field(default=None, gt=0)
    """Token limit per input (per query-document pair for rerankers); None uses the model's own limit."""

    truncate: Literal["end", "start", "error"] = "end"
    """What happens to inputs over `max_length`: cut at the end, cut at the start, or raise an error. Applied per
    call: objects differing only in it share one engine."""

    family: Literal["qwen3-embedding", "qwen3-reranker", "bi-encoder", "cross-encoder", "bge-m3"] | None = None
    """The model family; None reads it from the model directory (or, remote, from the server's description)."""

    trust_remote_code: bool = False
    """Run code shipped with the model (tokenizer or model classes); off unless you trust the source."""

    allow_pickle: bool = False
    """Load pickle weights (`*.bin`); off: only safetensors are loaded, as pickle can run code."""

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

    def __init__(self, **data: Any):
        super().__init__(**data)
        # Outside pydantic's validation, so core errors (ModelNotSupportedError...) reach the caller unwrapped.
        handle = get_engine(
            self.model,
            revision=self.revision,
            cache_folder=self.cache_folder,
            token=self.hf_token.get_secret_value() if self.hf_token is not None else None,
            base_url=self.base_url,
            api_key=self.api_key.get_secret_value() if self.api_key is not None else None,
            truncate=self.truncate,
            device=self.device,
            dtype=self.dtype,
            max_length=self.max_length,
            family=self.family,
            trust_remote_code=self.trust_remote_code,
            allow_pickle=self.allow_pickle,
            engine_kwargs=self.engine_kwargs,
            attach=False,
        )
        if self.base_url is None:  # the resolved snapshot's family, checked before an engine starts
            self._check_family(detect_family(handle.spec.model.path, max_length=self.max_length, family=self.family))
        handle.engine  # noqa: B018 - start (or join) the engine now, so a bad model fails here
        self._engine = handle

    @field_validator("model", mode="before")
    @classmethod
    def _model_path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    def _check_family(self, family: ModelFamily) -> None:
        """Raise ValueError when this model cannot serve the subclass (checked before an engine starts)."""

    @property
    def engine(self) -> Any:
        """This object's claim on the shared `rbln_retrieval` engine (or remote client): the engine's API, and
        `close()` releases this object's claim only."""
        return self._engine

    def _call_options(self) -> dict[str, Any]:
        """Per-call settings, read at each call so that assigning them takes effect."""
        return {"truncate": self.truncate, "timeout": self.timeout}



def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
