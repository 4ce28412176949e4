"""One entry point for framework integrations: a local shared engine, or a remote server when base_url is set."""

from __future__ import annotations

import os
from typing import Any

from rbln_retrieval.engine import PoolingEngine


def get_engine(
    model: str | os.PathLike[str],
    *,
    base_url: str | list[str] | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    **options: Any,
) -> Any:
    """The engine every framework object on ``model`` shares.

    Locally that is ``PoolingEngine.shared(model, **options)``; ``model`` is a directory or a Hugging Face id and
    ``options`` may hold ``revision``, ``cache_folder``, ``token`` and ``local_files_only`` besides the engine
    options. With ``base_url`` (one URL or a list of replicas) it is a client of `rbln-retrieval serve` with the
    same ``embed``/``score``/``rerank`` API, sync and async; the client reads prompts from the model's configs.
    """
    if base_url is None:
        return PoolingEngine.shared(model, **options)
    from rbln_retrieval.remote import RemoteEngine

    return RemoteEngine.shared(model, base_url=base_url, api_key=api_key, timeout=timeout, **options)
