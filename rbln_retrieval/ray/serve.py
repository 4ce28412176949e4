"""`rbln-retrieval serve` on Ray Serve: each replica runs vLLM's OpenAI-compatible app, built from the same family
presets, behind Ray Serve's HTTP proxy.

No second HTTP API: every replica builds the app vLLM's own server runs (``build_app`` + ``init_app_state`` over
an engine client made from ``rbln_retrieval.server.serve.server_args``), so the routes (/v1/embeddings, /classify,
/score, /rerank, /health, /metrics, /v1/models), the served model name and the API key check are those of
`rbln-retrieval serve`, and ``RemoteEngine`` clients work against the proxy unchanged.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from ray import serve

from rbln_retrieval.ray.resources import announce_placement, engine_resources

DEPLOYMENT_NAME = "rbln-retrieval"


@serve.ingress()
class PoolingServer:
    """One replica: one vLLM engine (on the replica's RBLN NPU, else the CPU) and vLLM's app over it."""

    async def __init__(self, model: str, api_key: str | None, options: dict[str, Any]):  # type: ignore[misc]
        # Ray Serve awaits an async constructor: the replica is ready once vLLM's engine is.
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
        from vllm.entrypoints.launchers.app import build_app

        from rbln_retrieval import backend
        from rbln_retrieval.local.engine_args import cpu_threads_env
        from rbln_retrieval.server.serve import server_args

        announce_placement("serve replica")
        args, target = server_args(model, api_key=api_key, **options)
        self._stack = contextlib.AsyncExitStack()
        # vLLM's engine processes start inside the block and inherit the backend choice (and the NPU Ray assigned).
        with backend.activated(target, cpu_threads_env() if target != "rbln" else None):
            engine = await self._stack.enter_async_context(build_async_engine_client(args))
        tasks = await engine.get_supported_tasks()
        self._app = build_app(args, tasks, engine.model_config)
        await init_app_state(engine, self._app.state, args, tasks)

    def __serve_build_asgi_app__(self) -> Any:
        return self._app

    async def __del__(self) -> None:
        await self._stack.aclose()


def pooling_app(
    model: str,
    *,
    api_key: str | None = None,
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
    ``num_replicas``; ``deployment_options`` pass any other ``Deployment.options`` through. ``api_key`` (default:
    ``RBLN_API_KEY``) is required as a bearer token on every route but /health; ``engine_options`` are those of
    ``rbln-retrieval serve`` (``device``, ``dtype``, ``max_length``, ``revision``, ...).
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
    return deployment.bind(str(model), api_key, engine_options)
