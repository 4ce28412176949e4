"""`rbln-retrieval serve` on Ray Serve: each replica runs the app `rbln-retrieval serve` runs, built from the same
family presets, behind Ray Serve's HTTP proxy.

No second HTTP API: every replica starts its engine and builds its app with the functions `rbln-retrieval serve`
uses (``rbln_retrieval.server.serve``: server_setup, start_engine, build_served_app), so the route table (the
OpenAI, TEI, Cohere v2 and Jina dialects and the package's own routes), the API key on every route but the probes,
backpressure and the size limits are those of the server, and ``RemoteEngine`` clients work against the proxy
unchanged. ``server_setup`` resolves vLLM's platform before the replica's first vLLM import, so an NPU host's
vllm-rbln plugin never becomes the replica's platform.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ray import serve

from rbln_retrieval.ray.resources import announce_placement, engine_resources
from rbln_retrieval.server.limits import Limits

DEPLOYMENT_NAME = "rbln-retrieval"


@serve.ingress()
class PoolingServer:
    """One replica: one PoolingEngine (on the replica's RBLN NPU, else the CPU) and the server's app over it."""

    async def __init__(self, model: str, api_key: str | None, limits: Any, options: dict[str, Any]):  # type: ignore[misc]
        # Ray Serve awaits an async constructor: the replica is ready once its engine is.
        from rbln_retrieval import backend
        from rbln_retrieval.local.engine_args import cpu_threads_env
        from rbln_retrieval.server.serve import build_served_app, server_setup, start_engine

        announce_placement("serve replica")
        limits = limits if isinstance(limits, Limits) else Limits(**(limits or {}))
        setup = server_setup(model, limits=limits, api_key=api_key, **options)  # resolves vLLM's platform first
        # vLLM's engine processes start inside the block and inherit the backend choice (and the NPU Ray assigned).
        with backend.activated(setup.target, cpu_threads_env() if setup.target != "rbln" else None):
            self._engine = await asyncio.to_thread(start_engine, model, setup)
        self._app = build_served_app(self._engine, setup, limits)

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    def __del__(self) -> None:
        self._engine.close()


def pooling_app(
    model: str,
    *,
    api_key: str | None = None,
    limits: Limits | dict[str, int | None] | None = None,
    num_replicas: int = 1,
    autoscaling_config: dict[str, Any] | None = None,
    num_cpus: float | None = None,
    ray_actor_options: dict[str, Any] | None = None,
    deployment_options: dict[str, Any] | None = None,
    **engine_options: Any,
) -> serve.Application:
    """A Ray Serve application serving ``model`` as `rbln-retrieval serve` does; run it with ``serve.run``.

    Each replica asks for one RBLN NPU when the cluster declares them, else ``num_cpus`` CPUs (default 1).
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
    api_key = api_key or os.environ.get("RBLN_API_KEY")
    scaling = {"autoscaling_config": autoscaling_config} if autoscaling_config else {"num_replicas": num_replicas}
    deployment = serve.deployment(PoolingServer).options(  # type: ignore[attr-defined]  # Ray's stub: a decorator
        name=DEPLOYMENT_NAME,
        ray_actor_options={**engine_resources(num_cpus), **(ray_actor_options or {})},
        **scaling,
        **(deployment_options or {}),
    )
    return deployment.bind(str(model), api_key, limits, engine_options)
