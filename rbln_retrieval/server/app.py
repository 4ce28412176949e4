"""The one app both servers run: `rbln-retrieval serve` (serve.py) and each Ray Serve replica (ray/serve.py).

vLLM's OpenAI-compatible app over an engine client, with what this package adds in front of it and beside it, in
the order a request meets them: the API key on every route but the probes (auth.py), backpressure and what one
request may cost (limits.py), the images it carries (images.py), then vLLM's routes plus the model's description
(GET DESCRIBE_PATH) and quantized embeddings (quantized.py). A plain function over vLLM's public builders, so both
servers get the same routes and guards without patching vLLM's modules.

Imports: engines (protocol), server (auth, images, limits, quantized); vLLM's app builders inside the function (the
caller has chosen vLLM's platform by then: backend.pin_platform).
"""

from __future__ import annotations

import argparse
from typing import Any

from rbln_retrieval.engines.protocol import DESCRIBE_PATH
from rbln_retrieval.server.limits import Limits


async def build_pooling_app(
    engine_client: Any, args: argparse.Namespace, *, description: dict[str, Any], limits: Limits
) -> Any:
    """vLLM's app for ``engine_client`` (its state initialised, ready to serve) with the description route, the
    quantized route, ``limits``, the check of images and the API key of ``args`` (``args.api_key``) on every route
    but the probes."""
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app

    from rbln_retrieval.server.auth import guard_every_route
    from rbln_retrieval.server.images import ImageCheck
    from rbln_retrieval.server.limits import add_backpressure
    from rbln_retrieval.server.quantized import add_quantized_route

    tasks = await engine_client.get_supported_tasks()
    app = build_app(args, tasks, engine_client.model_config)
    await init_app_state(engine_client, app.state, args, tasks)
    app.add_api_route(DESCRIBE_PATH, lambda: description, methods=["GET"], include_in_schema=True)
    add_quantized_route(app)
    images = ImageCheck(
        model=description["model"],
        family=description["family"],
        allowed_domains=getattr(args, "allowed_media_domains", None),
    )
    add_backpressure(app, limits, images)
    guard_every_route(app, args.api_key)
    return app
