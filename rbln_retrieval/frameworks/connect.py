"""One entry point for framework integrations: a claim on a local shared engine, or on a client of remote servers
when base_url is set, and the typed API of that claim (EngineHandle and the options its calls take), for framework
objects to hold and call.

Imports: engines (options, requests, shared), frameworks (attach), local (engine), models (source), text (inputs);
remote (client) when the first remote client is made.
"""

from __future__ import annotations

import os
from typing import Any

from rbln_retrieval.engines.options import EngineOptions, local_model
from rbln_retrieval.engines.requests import EmbedOptions, RerankOptions, ScoreOptions
from rbln_retrieval.engines.shared import EngineHandle, EngineSpec
from rbln_retrieval.frameworks.attach import attached_engine, shares_across_processes
from rbln_retrieval.local.engine import PoolingEngine
from rbln_retrieval.models.source import SOURCE_ARGS
from rbln_retrieval.text.inputs import Truncate

__all__ = ["EmbedOptions", "EngineHandle", "RerankOptions", "ScoreOptions", "get_engine"]


def get_engine(
    model: str | os.PathLike[str],
    *,
    base_url: str | list[str] | None = None,
    api_key: str | None = None,
    timeout: float | None = None,
    truncate: Truncate = "end",
    attach: bool = True,
    **options: Any,
) -> EngineHandle:
    """A claim on the engine every holder of ``model`` and ``options`` shares, with the engine's API.

    Locally that is the process's shared ``PoolingEngine`` for ``model``, a directory or a Hugging Face id
    (``options`` may hold ``revision``, ``cache_folder``, ``token`` and ``local_files_only`` besides the engine
    options); with ``base_url`` (one URL or a list of replicas) a client of `rbln-retrieval serve` with the same
    ``embed``/``score``/``rerank`` API, sync and async. ``truncate`` and ``timeout`` are this holder's per-call
    defaults and never start a second engine. ``close()`` releases the claim. ``attach=False`` defers starting (or
    joining) the engine to the first call. A local engine is shared across this user's processes too (one process
    holds it, the others attach: frameworks/attach.py) on an RBLN NPU, or wherever RBLN_SHARE_ENGINES=1.
    """
    source_args = {name: options.pop(name) for name in SOURCE_ARGS if name in options}
    transport = ("batch_size", "max_retries", "verify", "max_in_flight") if base_url is not None else ()
    client = {name: options.pop(name) for name in transport if name in options}
    engine_options = EngineOptions(**options)  # the one construction a framework object's options get
    if base_url is None:
        # Across processes, the engine runs in the one process holding it (attach.py), under a key of its own.
        engine = attached_engine if shares_across_processes(engine_options) else PoolingEngine
        spec = EngineSpec(engine, local_model(model, engine_options, **source_args))
    else:
        from rbln_retrieval.remote.client import RemoteEngine  # httpx is imported with the first remote client

        urls = (base_url,) if isinstance(base_url, str) else tuple(base_url)
        spec = EngineSpec(
            RemoteEngine,
            os.fspath(model),
            engine_options,
            base_url=urls,
            api_key=api_key,
            client={**client, **source_args},
        )
    return EngineHandle(spec, truncate=truncate, timeout=timeout, attach=attach)
