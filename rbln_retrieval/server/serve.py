"""`rbln-retrieval serve`: vLLM's own OpenAI-compatible server with the bundled backend and the family's presets.

We write no HTTP server: this builds vLLM's serve arguments from the same preset table the in-process engine
uses (hf_overrides, pooling, max length, runner settings) and runs vLLM's API server, which exposes
/v1/embeddings, /classify, /score, /rerank, /health and /metrics (with an API key, the key guards every route but
the probes: see auth.py), and shuts down cleanly on SIGTERM. Two routes are added beside vLLM's own: GET
DESCRIBE_PATH describes the served model (family, prompts and templates, dimensions, max length), so clients
that have only the model's name score it exactly as local mode does; POST QUANTIZED_EMBED_PATH (quantized.py)
sends int8/uint8/binary vectors as their bytes.

Imports: backend, engines (options, protocol), local (device, engine_args), models, quiet, server (auth,
quantized); vLLM
and uvloop inside the functions that build and run the server.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from typing import Any

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.local.device import resolve_device
from rbln_retrieval.local.engine_args import cpu_threads_env, vllm_engine_kwargs
from rbln_retrieval.models.families import ModelFamily, check_remote_code, detect_family
from rbln_retrieval.models.files import check_weights
from rbln_retrieval.models.source import SOURCE_ARGS, ModelSource
from rbln_retrieval.quiet import quiet_vllm


def describe(model: str, family: ModelFamily) -> dict[str, Any]:
    """What GET DESCRIBE_PATH answers: every field of the family, which RemoteEngine turns back into it."""
    return {"model": model, "family": dataclasses.asdict(family), "quantized_embeddings": QUANTIZED_EMBED_PATH}


def _served_model(model: str, options: dict[str, Any]) -> tuple[ModelSource, EngineOptions, ModelFamily]:
    """The resolved snapshot, the engine options and the family ``model`` is served with."""
    options = dict(options)
    source_args = {name: options.pop(name) for name in SOURCE_ARGS if name in options}
    opts = EngineOptions(**options)
    source = opts.resolve_source(model, **source_args)
    family = detect_family(source.path, max_length=opts.max_length, family=opts.family)
    check_remote_code(source.path, family, trust_remote_code=opts.trust_remote_code)
    return source, opts, family


def server_args(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    **options: Any,
) -> tuple[argparse.Namespace, str | None]:
    """vLLM's parsed serve arguments for ``model`` (a directory or a Hugging Face id, resolved as PoolingEngine
    does) and the bundled-backend target to activate (None: stock). The server publishes the name it was started
    with: the repo id for a hub model (without ``@revision``, as ``vllm serve`` does), else the directory."""
    source, opts, family = _served_model(model, options)
    check_weights(source.path, allow_pickle=opts.allow_pickle)
    device = resolve_device(opts.device)
    target = opts.target(device)
    kwargs = vllm_engine_kwargs(source.path, family, opts, device=device, model_key=str(source))
    quiet_vllm()
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    for name, value in kwargs.items():
        setattr(args, name, value)
    args.host, args.port = host, port
    # The key travels in the namespace, never on a command line where `ps` would show it.
    args.api_key = [api_key] if api_key else None
    args.served_model_name = [source.name]
    validate_parsed_serve_args(args)
    return args, target


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None, **options: Any) -> int:
    """Run the server in this process until SIGTERM or Ctrl-C; returns the exit code."""
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server

    from rbln_retrieval import backend

    api_key = api_key or os.environ.get("RBLN_API_KEY")
    args, target = server_args(model, host=host, port=port, api_key=api_key, **options)
    source, _, family = _served_model(model, options)
    _publish_description(describe(source.name, family))
    with backend.activated(target, cpu_threads_env() if target != "rbln" else None):
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop a foreground server
            uvloop.run(run_server(args))
    return 0


def _publish_description(description: dict[str, Any]) -> None:
    """Add GET DESCRIBE_PATH to the FastAPI app vLLM's server builds in this process, and make the API key guard
    every route of it (auth.py says why)."""
    from vllm.entrypoints.launchers.api_server import entry

    from rbln_retrieval.server.auth import guard_every_route
    from rbln_retrieval.server.quantized import add_quantized_route

    build_vllm_app = entry.build_app

    def build_app(args: argparse.Namespace, *rest: Any, **kwargs: Any) -> Any:
        app = build_vllm_app(args, *rest, **kwargs)
        app.add_api_route(DESCRIBE_PATH, lambda: description, methods=["GET"], include_in_schema=True)
        add_quantized_route(app)
        guard_every_route(app, args.api_key)
        return app

    entry.build_app = build_app
