"""`rbln-retrieval serve` on Ray Serve: each replica runs the app `rbln-retrieval serve` runs, built from the same
family presets, behind Ray Serve's HTTP proxy.

No second HTTP API: every replica starts its engines and builds its app with the functions `rbln-retrieval serve`
uses (``rbln_retrieval.server.serve``: server_setup, start_engine, build_served_app), so the route table (the
OpenAI, TEI, Cohere v2 and Jina dialects and the package's own routes), the models it dispatches to, the API key on
every route but the probes, backpressure and the size limits are those of the server, and ``RemoteEngine`` clients
work against the proxy unchanged. ``server_setup`` resolves vLLM's platform before the replica's first vLLM import,
so an NPU host's vllm-rbln plugin never becomes the replica's platform.

What `rbln-retrieval serve` does around its app is Ray's here: a replica with a dead engine fails Ray Serve's health
check (``check_health``), so Ray replaces it instead of routing requests to it; and the replica's concurrency bound
is the server's ``max_concurrent_requests`` (Ray's ``max_ongoing_requests``), with requests past it waiting in
Ray's queue up to the same number per deployment (``max_queued_requests``) and then answered HTTP 429 with the
server's Retry-After, as `rbln-retrieval serve` answers them.

The models are those `rbln-retrieval serve` takes: names, or config entries (``serve --config``'s TOML file, its
tables, or ModelEntry objects) with options and limits of their own. On an NPU cluster an entry's ``npus`` are
positions among the NPUs Ray gives the replica (it asks for as many as the highest position named, plus one):
``npus = [1]`` runs that model on the replica's second NPU, whichever NPU of the node Ray picked.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray import serve

from rbln_retrieval.ray.resources import (
    RBLN_VISIBLE_DEVICES_ENV,
    announce_placement,
    assigned_npus,
    engine_resources,
)
from rbln_retrieval.server.config import ModelEntry, read_config
from rbln_retrieval.server.limits import RETRY_AFTER_SECONDS, Limits

DEPLOYMENT_NAME = "rbln-retrieval"


@serve.ingress()
class PoolingServer:
    """One replica: the engines of `rbln-retrieval serve` (one per model, on the replica's RBLN NPU, else the CPU)
    and its app over them."""

    async def __init__(self, models: list[ModelEntry], api_key: str | None, limits: Any, options: dict[str, Any]):  # type: ignore[misc]
        # Ray Serve awaits an async constructor: the replica is ready once its engines are.
        from rbln_retrieval import backend
        from rbln_retrieval.server.serve import as_limits, build_served_app, entry_setups, start_engine

        announce_placement("serve replica")
        limits = as_limits(limits)
        # entry_setups resolves vLLM's platform first, as `rbln-retrieval serve` does.
        entries, setups = entry_setups(models, limits, options, api_key=api_key)
        assigned = assigned_npus()
        self._engines: list[Any] = []
        for entry, setup in zip(entries, setups, strict=True):
            # The engine's processes start inside the block and inherit the backend choice and their NPUs.
            env = replica_devices(entry, assigned) if setup.target == "rbln" else {}
            with backend.activated(setup.target, env):
                self._engines.append(await asyncio.to_thread(start_engine, setup))
        self._app = build_served_app(self._engines, setups, limits)

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    async def check_health(self) -> None:
        """Ray Serve's periodic health check: raises once one of the replica's engines is dead, so Ray replaces this
        replica (the watchdog that ends `rbln-retrieval serve` does not run in a replica)."""
        if any(engine.errored for engine in self._engines):
            raise RuntimeError("An engine of the replica is dead; Ray replaces the replica.")

    def __del__(self) -> None:
        for engine in self._engines:
            engine.close()


def replica_devices(entry: ModelEntry, assigned: list[str]) -> dict[str, str]:
    """The environment of ``entry``'s engine in a replica Ray gave the NPUs ``assigned``: its ``npus`` are
    positions among them (unset: all of them, as Ray set them)."""
    if not entry.npus:
        return {}
    if max(entry.npus) >= len(assigned):
        raise ValueError(
            f"{entry.model}: npus={entry.npus} names the replica's NPU {max(entry.npus)}, but Ray gave the replica "
            f"{len(assigned)} ({','.join(assigned) or 'none'}); a replica asks for one more than the highest named."
        )
    return {RBLN_VISIBLE_DEVICES_ENV: ",".join(assigned[position] for position in entry.npus)}


def replica_npus(entries: list[ModelEntry]) -> int:
    """The NPUs one replica of ``entries`` asks Ray for: one more than the highest position an entry names (1)."""
    return max((max(entry.npus) + 1 for entry in entries if entry.npus), default=1)


def pooling_app(
    model: str | os.PathLike[str] | Sequence[str | dict[str, Any] | ModelEntry] | None = None,
    *,
    config: str | Path | None = None,
    api_key: str | None = None,
    limits: Limits | dict[str, int | None] | None = None,
    num_replicas: int = 1,
    autoscaling_config: dict[str, Any] | None = None,
    num_cpus: float | None = None,
    ray_actor_options: dict[str, Any] | None = None,
    deployment_options: dict[str, Any] | None = None,
    **engine_options: Any,
) -> serve.Application:
    """A Ray Serve application serving ``model`` (one, or a list of names or config entries: each request names
    its own) or the models of the TOML file ``config``, as `rbln-retrieval serve` does; run it with ``serve.run``.

    Each replica asks for one RBLN NPU when the cluster declares them (or as many as its entries' ``npus``
    name), else ``num_cpus`` CPUs (default 1).
    ``autoscaling_config`` (Ray Serve's, e.g. ``{"min_replicas": 1, "max_replicas": 8}``) replaces the fixed
    ``num_replicas``; ``deployment_options`` pass any other ``Deployment.options`` through. ``api_key``
    (default: ``RBLN_API_KEY``) is required as a bearer token on every route but the probes (/health, /ping,
    /metrics, /version); ``limits`` bound each replica as `rbln-retrieval serve`'s (default: Limits());
    ``engine_options`` are those of ``rbln-retrieval serve`` (``device``, ``dtype``, ``max_length``,
    ``revision``, ...).
    """
    if autoscaling_config is None and (
        isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1
    ):
        raise ValueError(f"num_replicas={num_replicas!r} must be a positive integer.")
    from rbln_retrieval.server.serve import as_limits, served_entries

    if model is not None and config is None:
        entries = served_entries(model)
    elif model is None and config is not None:
        entries = read_config(config)
    else:
        raise ValueError("pooling_app takes its models as `model` or from `config` (a TOML file), one of them.")
    limits = as_limits(limits)
    for entry in entries:  # refused here, in the driver, rather than in every replica
        limits.tightened(entry.limits, entry.model)
    api_key = api_key or os.environ.get("RBLN_API_KEY")
    scaling = {"autoscaling_config": autoscaling_config} if autoscaling_config else {"num_replicas": num_replicas}
    deployment = serve.deployment(PoolingServer).options(  # type: ignore[attr-defined]  # Ray's stub: a decorator
        name=DEPLOYMENT_NAME,
        ray_actor_options={**engine_resources(num_cpus, replica_npus(entries)), **(ray_actor_options or {})},
        **scaling,
        **{**ray_bounds(limits), **(deployment_options or {})},
    )
    return deployment.bind(entries, api_key, limits, engine_options)


def ray_bounds(limits: Limits) -> dict[str, Any]:
    """Ray Serve's bounds for a replica under ``limits``: as many requests in flight as `rbln-retrieval serve`
    admits, as many more waiting in Ray's queue, and past them HTTP 429 with the server's Retry-After (Ray's default
    is a few requests in flight, an unbounded queue and 503). Unbounded limits leave Ray's defaults."""
    bound = limits.max_concurrent_requests
    if bound is None:
        return {}
    return {
        "max_ongoing_requests": bound,
        "max_queued_requests": bound,
        "backpressure_config": {"status_code": 429, "retry_after_s": RETRY_AFTER_SECONDS},
    }
