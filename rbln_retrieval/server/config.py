"""The models a server hosts, each with its own options and NPUs: `rbln-retrieval serve --config models.toml`, or
the entries serve() takes in place of model names.

A TOML file (read by the standard library's tomllib: no parser to install, and the format of pyproject.toml) holds
one ``[[models]]`` table a model. Its keys are the engine options' own names (rbln_retrieval.engines.options:
SourceOptions and ComputeOptions, the vocabulary the CLI's flags and the framework objects' fields come from),
plus ``model`` (a directory or a Hugging Face id), ``npus`` (the NPU ids the model runs on, RBLN_VISIBLE_DEVICES
for its engine; ignored where the model runs on the CPU, so one file serves an NPU host and a laptop) and the limits
a model may set for itself (limits.py's MODEL_LIMITS, the names of serve's flags: they tighten the server's for this
model). A bad file is refused with one sentence a bad field, each naming the file, the entry and the key.

Imports: engines (options), backend (the NPU-visibility variable), server (limits); pydantic, tomllib.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError, model_validator

from rbln_retrieval.backend import VISIBLE_DEVICES_ENV
from rbln_retrieval.engines.options import ComputeOptions, SourceOptions
from rbln_retrieval.server.limits import MODEL_LIMITS


class ModelEntry(ComputeOptions, SourceOptions):
    """One served model: ``model``, its NPUs and the engine options it runs with (unset ones: the server's)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = Field(min_length=1)
    """A local model directory, or a Hugging Face id (org/name[@revision])."""

    npus: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=1)
    """The NPU ids this model runs on (RBLN_VISIBLE_DEVICES of its engine); unset: the NPUs the server may use."""

    limits: dict[str, Annotated[int, Field(ge=1)]] = Field(default_factory=dict)
    """This model's own limits (MODEL_LIMITS keys, given as keys of the entry itself), tightening the server's."""

    @model_validator(mode="before")
    @classmethod
    def _gather_limits(cls, table: Any) -> Any:
        """An entry's limit keys stand beside its other keys, as serve's flags do; they are kept under ``limits``."""
        if not isinstance(table, dict):
            return table
        if "limits" in table:  # not a key of an entry: made invalid, so it is refused as an unknown key is
            return {**table, "limits": None}
        own = {name: table[name] for name in MODEL_LIMITS if name in table}
        return {**{key: value for key, value in table.items() if key not in own}, "limits": own}

    def options(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """The engine options of this model: those set in its entry, over the server's ``defaults``."""
        return {**defaults, **self.model_dump(exclude={"model", "npus", "limits"}, exclude_unset=True)}

    def device_env(self) -> dict[str, str]:
        """The environment its engine starts in on an NPU: the NPUs named for it."""
        return {VISIBLE_DEVICES_ENV: ",".join(map(str, self.npus))} if self.npus else {}


def model_entry(entry: str | dict[str, Any] | ModelEntry, where: str = "the model") -> ModelEntry:
    """``entry`` (a model name, a table of a config file, or an entry) as a ModelEntry; a bad table is refused
    with one sentence a bad field, naming ``where`` it is."""
    if isinstance(entry, ModelEntry):
        return entry
    if isinstance(entry, str):
        return ModelEntry(model=entry)
    try:
        return ModelEntry.model_validate(entry)
    except ValidationError as error:
        raise ValueError("\n".join(_sentence(where, problem) for problem in error.errors())) from None


def _sentence(where: str, problem: Any) -> str:
    key = ".".join(str(part) for part in problem["loc"]).removeprefix("limits.") or "(the entry)"
    if problem["type"] == "extra_forbidden" or key == "limits":
        known = ", ".join(sorted({*ModelEntry.model_fields, *MODEL_LIMITS} - {"limits"}))
        return f"{where}: {key} is not an option of a served model (those are: {known})."
    if problem["type"] == "missing":
        return f"{where}: {key} is missing; every model needs one."
    return f"{where}: {key}={problem.get('input')!r} is refused: {problem['msg']}."


def read_config(path: str | Path) -> list[ModelEntry]:
    """The served models a config file lists, in its order; every bad field refused in one sentence each."""
    path = Path(path)
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"The config file {path} cannot be read: {error.strerror}.") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"The config file {path} is not valid TOML: {error}.") from None
    if unknown := sorted(set(table) - {"models"}):
        raise ValueError(f"{path}: {', '.join(unknown)} is not a key of a config file; it lists [[models]] only.")
    models = table.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(entry, dict) for entry in models):
        raise ValueError(f'{path} lists no model: give one [[models]] table a model, each with model = "...".')
    entries, problems = [], []
    for number, entry in enumerate(models, 1):
        try:
            entries.append(model_entry(entry, f"{path}, model {number}"))
        except ValueError as error:
            problems.append(str(error))
    if problems:
        raise ValueError("\n".join(problems))
    return entries


def served_models(config: str | Path | None, models: list[str]) -> list[str] | list[ModelEntry]:
    """What `serve` serves: the models of ``config`` when a file is given, else ``models`` as named."""
    if config is None:
        return models
    if models:
        raise ValueError(f"serve takes its models from --config {config} or as arguments, not both.")
    return read_config(config)
