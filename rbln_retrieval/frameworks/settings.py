"""The engine settings every framework object exposes, declared once as pydantic fields with their documentation,
and how a framework object turns them into its claim on a shared engine (rbln_retrieval.get_engine).

LangChain's and LlamaIndex's classes inherit these fields; each adds its model field (``model`` or
``model_name``) and its own per-call fields (batch size, prompts, top_n...).

Imports: frameworks (connect, foreign), engines (options, shared), text (inputs); pydantic.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from typing import Any, ClassVar, Self

from pydantic import ConfigDict, Field, SecretStr, field_serializer, field_validator, model_validator

from rbln_retrieval.engines.options import ComputeOptions, SourceOptions
from rbln_retrieval.engines.shared import EngineHandle
from rbln_retrieval.frameworks.connect import get_engine
from rbln_retrieval.frameworks.foreign import refuse_foreign_options
from rbln_retrieval.text.inputs import Chunk, Truncate

API_KEY_ENV = "RBLN_API_KEY"

# The settings that select the shared engine: equal values share one engine, and they cannot change after
# construction. Every other field is read at each call, so assigning it takes effect.
ENGINE_SETTINGS = frozenset(
    {*SourceOptions.model_fields, "hf_token", *ComputeOptions.model_fields, "base_url", "api_key"}
)


class EngineHolder:
    """The lifecycle a framework object holding a claim in ``_engine`` shares with the others: ``close()``, ``with``,
    and the fields in ``_frozen_fields`` (those that chose the engine) refused after construction."""

    _frozen_fields: ClassVar[frozenset[str]] = frozenset()
    _engine: Any

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._frozen_fields:
            raise ValueError(
                f"{name} selects the engine of this {type(self).__name__} and cannot change after construction; "
                "create a new object instead."
            )
        super().__setattr__(name, value)

    def close(self) -> None:
        """Release this object's claim on the shared engine; the engine closes when its last holder does."""
        self._engine.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def shown_url(url: str) -> str:
    """``url`` with the password its user part may hold (``https://user:password@host``) replaced by ``***``."""
    parts = urllib.parse.urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{userinfo.partition(':')[0]}:***@{host}"))


def _shown_urls(value: Any) -> Any:
    """A base_url setting (one URL, a list, None) as it may be shown: passwords masked."""
    if isinstance(value, str):
        return shown_url(value)
    return [shown_url(url) if isinstance(url, str) else url for url in value] if isinstance(value, list) else value


def _api_key_from_env() -> SecretStr | None:
    key = os.environ.get(API_KEY_ENV)
    return SecretStr(key) if key else None


class EngineSettings(EngineHolder, ComputeOptions, SourceOptions):
    """Where the model comes from, where and how it runs, and the remote server, for a framework object. The
    source and compute options are declared once, in rbln_retrieval.engines.options."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    _frozen_fields: ClassVar[frozenset[str]] = ENGINE_SETTINGS

    hf_token: SecretStr | None = Field(default=None, exclude=True)
    """Hugging Face token for gated or private models; None uses huggingface_hub's own (`HF_TOKEN`, or
    `hf auth login`). Never logged, shown or serialized."""

    truncate: Truncate = "end"
    """What happens to inputs over `max_length`: cut at the end, cut at the start, raise an error, or `"chunk"` /
    `Chunk(overlap=...)`: windows of `max_length` combined (embeddings: token-weighted mean; scores: the best
    window's). Applied per call: objects differing only in it share one engine."""

    base_url: str | list[str] | None = None
    """URL of an `rbln-retrieval serve` server (or a list of replicas); None runs the model in this process. A
    password in it (`https://user:password@host`) is sent as basic auth and shown, dumped or logged as `***`."""

    api_key: SecretStr | None = Field(default_factory=_api_key_from_env, exclude=True)
    """Server API key; read from the `RBLN_API_KEY` environment variable when not given. Never serialized."""

    timeout: float | None = Field(default=None, gt=0)
    """Seconds to wait for the server per request (remote mode only)."""

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_options(cls, data: Any) -> Any:
        refuse_foreign_options(cls.__name__, data)
        return data

    @field_validator("truncate")
    @classmethod
    def _one_result_per_input(cls, value: Truncate) -> Truncate:
        if isinstance(value, Chunk) and value.output == "all":
            raise ValueError(
                "Chunk(output='all') gives every window's vector, and a framework object one result per input; "
                "use truncate='chunk' or Chunk(overlap=...)."
            )
        return value

    @field_serializer("base_url")
    def _base_url_shown(self, value: str | list[str] | None) -> Any:
        return _shown_urls(value)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:  # repr() and str(): the base URL's password masked
        for name, value in super().__repr_args__():
            yield name, (_shown_urls(value) if name == "base_url" else value)

    def _claim(self, model: str) -> EngineHandle:
        """A claim on the shared engine these settings select, started (or joined) at its first use."""
        return get_engine(
            model,
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
