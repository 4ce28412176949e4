"""`rbln-retrieval serve`: vLLM's own OpenAI-compatible server with the bundled backend and the family's presets.

We write no HTTP server: this builds vLLM's serve arguments from the same preset table the in-process engine
uses (hf_overrides, pooling, max length, runner settings) and runs vLLM's API server, which exposes
/v1/embeddings, /classify, /score, /rerank, /health and /metrics (with an API key, the key guards every route but
the probes: see auth.py), and shuts down cleanly on SIGTERM. Two routes are added beside vLLM's own: GET
DESCRIBE_PATH describes the served model (family, prompts and templates, dimensions, max length), so clients
that have only the model's name score it exactly as local mode does; POST QUANTIZED_EMBED_PATH (quantized.py)
sends int8/uint8/binary vectors as their bytes. Backpressure (limits.py) bounds the requests in flight, the tokens
they queue and a request's size, and the description advertises those bounds so clients split their calls under them.

vLLM's own frontend options (TLS, uvicorn's log level, request logging, tracing, max concurrent sequences, ...) pass
through as ``vllm_args``, parsed by vLLM's own parser: the options we set from the presets keep our values, and one of
them given another value there is refused naming it.

Imports: backend, engines (options, protocol), local (device, engine_args), models, quiet, server (auth, limits,
quantized); vLLM and uvloop inside the functions that build and run the server.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
from collections.abc import Sequence
from typing import Any, NoReturn

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.local.device import resolve_device
from rbln_retrieval.local.engine_args import cpu_threads_env, vllm_engine_kwargs
from rbln_retrieval.models.families import ModelFamily, check_remote_code, detect_family
from rbln_retrieval.models.files import check_weights
from rbln_retrieval.models.source import SOURCE_ARGS, ModelSource
from rbln_retrieval.quiet import quiet_vllm
from rbln_retrieval.server.limits import Limits

# vLLM options that start other processes or another protocol, where our routes and limits would not be installed.
UNSUPPORTED_VLLM_OPTIONS = ("api_server_count", "headless", "grpc")


def describe(model: str, family: ModelFamily, limits: Limits | None = None) -> dict[str, Any]:
    """What GET DESCRIBE_PATH answers: every field of the family, which RemoteEngine turns back into it, and the
    server's limits, under which it splits its calls."""
    return {
        "model": model,
        "family": dataclasses.asdict(family),
        "quantized_embeddings": QUANTIZED_EMBED_PATH,
        "limits": (limits or Limits()).advertised(),
    }


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
    vllm_args: Sequence[str] = (),
    **options: Any,
) -> tuple[argparse.Namespace, str | None]:
    """vLLM's parsed serve arguments for ``model`` (a directory or a Hugging Face id, resolved as PoolingEngine
    does) and the bundled-backend target to activate (None: stock). The server publishes the name it was started
    with: the repo id for a hub model (without ``@revision``, as ``vllm serve`` does), else the directory.
    ``vllm_args`` are vLLM's own serve options (``--ssl-certfile F``, ``--uvicorn-log-level warning``, ...)."""
    source, opts, family = _served_model(model, options)
    check_weights(source.path, allow_pickle=opts.allow_pickle)
    device = resolve_device(opts.device)
    target = opts.target(device)
    kwargs = vllm_engine_kwargs(source.path, family, opts, device=device, model_key=str(source))
    quiet_vllm()
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="rbln-retrieval serve MODEL --"))
    parser.error = _refuse_vllm_args  # type: ignore[method-assign]  # a sentence, not argparse's exit
    defaults, args = parser.parse_args([]), parser.parse_args(list(vllm_args))
    # The key travels in the namespace, never on a command line where `ps` would show it.
    ours = {
        **kwargs,
        "host": host,
        "port": port,
        "api_key": [api_key] if api_key else None,
        "served_model_name": [source.name],
        "model_tag": None,
    }
    for name, value in vars(args).items():
        if value == getattr(defaults, name):
            continue
        flag = "a model after `--`" if name == "model_tag" else "--" + name.replace("_", "-")
        if name in UNSUPPORTED_VLLM_OPTIONS:
            raise ValueError(f"{flag} is not supported by rbln-retrieval serve (one API server process, HTTP).")
        if name in ours and value != ours[name]:
            raise ValueError(
                f"{flag} is set by rbln-retrieval serve itself (from its own options and the model's presets); "
                "give it there, not among vLLM's options."
            )
    for name, value in ours.items():
        setattr(args, name, value)
    validate_parsed_serve_args(args)
    return args, target


def _refuse_vllm_args(message: str) -> NoReturn:
    raise ValueError(f"vLLM's server options were refused: {message}.")


def serve(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: Limits | dict[str, int | None] | None = None,
    vllm_args: Sequence[str] = (),
    **options: Any,
) -> int:
    """Run the server in this process until SIGTERM or Ctrl-C; returns the exit code. ``limits`` bound the
    requests in flight, their queued tokens and a request's size (default: Limits())."""
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server

    from rbln_retrieval import backend

    api_key = api_key or os.environ.get("RBLN_API_KEY")
    limits = limits if isinstance(limits, Limits) else Limits(**(limits or {}))
    args, target = server_args(model, host=host, port=port, api_key=api_key, vllm_args=vllm_args, **options)
    source, _, family = _served_model(model, options)
    _publish_description(describe(source.name, family, limits), limits)
    with backend.activated(target, cpu_threads_env() if target != "rbln" else None):
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop a foreground server
            uvloop.run(run_server(args))
    return 0


def _publish_description(description: dict[str, Any], limits: Limits) -> None:
    """Add GET DESCRIBE_PATH to the FastAPI app vLLM's server builds in this process, bound it by ``limits`` and
    make the API key guard every route of it (auth.py says why), outside the bounds: strangers get 401, never 429."""
    from vllm.entrypoints.launchers.api_server import entry

    from rbln_retrieval.server.auth import guard_every_route
    from rbln_retrieval.server.limits import add_backpressure
    from rbln_retrieval.server.quantized import add_quantized_route

    build_vllm_app = entry.build_app

    def build_app(args: argparse.Namespace, *rest: Any, **kwargs: Any) -> Any:
        app = build_vllm_app(args, *rest, **kwargs)
        app.add_api_route(DESCRIBE_PATH, lambda: description, methods=["GET"], include_in_schema=True)
        add_quantized_route(app)
        add_backpressure(app, limits)
        guard_every_route(app, args.api_key)
        return app

    entry.build_app = build_app
