"""`rbln-retrieval serve`: vLLM's own OpenAI-compatible server with the bundled backend and the family's presets.

We write no HTTP server: this builds vLLM's serve arguments from the same preset table the in-process engine uses
(hf_overrides, pooling, max length, runner settings) and runs vLLM's API server loop over the app app.py builds (the
same app a Ray Serve replica runs): /v1/embeddings, /classify, /score, /rerank, /health and /metrics (with an API
key, the key guards every route but the probes: see auth.py). It shuts down cleanly on SIGTERM and exits non-zero
when the engine died under it. Two routes are added beside vLLM's own: GET DESCRIBE_PATH describes the served model
(family, prompts and templates, dimensions, max length), so clients that have only the model's name score it exactly
as local mode does; POST QUANTIZED_EMBED_PATH (quantized.py) sends int8/uint8/binary vectors as their bytes.
Backpressure (limits.py) bounds the requests in flight, the tokens they queue and a request's size, and the
description advertises those bounds so clients split their calls under them.

vLLM's own frontend options (TLS, uvicorn's log level, request logging, tracing, max concurrent sequences, ...) pass
through as ``vllm_args``, parsed by vLLM's own parser: the options we set from the presets keep our values, and one of
them given another value there is refused naming it.

Imports: backend, engines (options, protocol), local (device, engine_args), models, quiet, server (app, limits);
vLLM and uvloop inside the functions that build and run the server, after backend.pin_platform.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
from collections.abc import Sequence
from typing import Any, NoReturn

from rbln_retrieval import backend
from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import QUANTIZED_EMBED_PATH
from rbln_retrieval.local.device import resolve_device
from rbln_retrieval.local.engine_args import cpu_threads_env, vllm_engine_kwargs
from rbln_retrieval.models.families import ModelFamily, check_remote_code, detect_family
from rbln_retrieval.models.files import check_weights
from rbln_retrieval.models.source import SOURCE_ARGS, ModelSource
from rbln_retrieval.quiet import quiet_vllm
from rbln_retrieval.server.app import build_pooling_app
from rbln_retrieval.server.limits import Limits

logger = logging.getLogger(__name__)

# serve()'s exit code when the engine died under the server (1 is the CLI's for errors before it starts).
ENGINE_DIED = 3
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
    if family.spec.unserved:
        raise ValueError(f"{model} cannot be served by rbln-retrieval serve: {family.spec.unserved}.")
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
    ``vllm_args`` are vLLM's own serve options (``--ssl-certfile F``, ``--uvicorn-log-level warning``, ...).

    vLLM's platform in this process is resolved here, under the target's plugin scope, before the first vLLM
    import (backend.pin_platform): the API server runs on this package's platform even where vllm-rbln's plugin
    is installed and would win a bare ``import vllm``."""
    setup = server_setup(model, host=host, port=port, api_key=api_key, vllm_args=vllm_args, **options)
    return setup.args, setup.target


@dataclasses.dataclass(frozen=True)
class ServerSetup:
    """What a server of one model runs: vLLM's serve arguments, the backend target (None: stock) and the body of
    GET DESCRIBE_PATH."""

    args: argparse.Namespace
    target: str | None
    description: dict[str, Any]


def server_setup(
    model: str,
    *,
    limits: Limits | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    vllm_args: Sequence[str] = (),
    **options: Any,
) -> ServerSetup:
    """server_args' arguments and target, and the description the server publishes under ``limits``."""
    source, opts, family = _served_model(model, options)
    check_weights(source.path, allow_pickle=opts.allow_pickle)
    device = resolve_device(opts.device)
    target = opts.target(device)
    backend.pin_platform(target)  # before anything below imports vLLM
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
    return ServerSetup(args, target, describe(source.name, family, limits))


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
    """Run the server in this process until SIGTERM or Ctrl-C; returns the exit code: 0 after a requested stop,
    ENGINE_DIED when the engine died under it (vLLM's watchdog stopped the server), so that a supervisor restarts
    it. ``limits`` bound the requests in flight, their queued tokens and a request's size (default: Limits())."""
    api_key = api_key or os.environ.get("RBLN_API_KEY")
    limits = limits if isinstance(limits, Limits) else Limits(**(limits or {}))
    setup = server_setup(model, limits=limits, host=host, port=port, api_key=api_key, vllm_args=vllm_args, **options)
    import uvloop

    with backend.activated(setup.target, cpu_threads_env() if setup.target != "rbln" else None):
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop a foreground server
            return uvloop.run(_run_server(setup.args, setup.description, limits))
    return 0


async def _run_server(args: argparse.Namespace, description: dict[str, Any], limits: Limits) -> int:
    """vLLM's single-process API server loop (its entry.run_server) over the app both servers build."""
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server

    # A SIGTERM before uvicorn installs its handlers interrupts the start, as in vLLM's own server.
    signal.signal(signal.SIGTERM, _interrupt_start)
    _, sock = setup_server(args, reuse_port=False)
    try:
        async with build_async_engine_client(args) as engine:
            app = await build_pooling_app(engine, args, description=description, limits=limits)
            shutdown = await serve_http(app, sock=sock, **_uvicorn_options(args))
            # After SIGTERM or Ctrl-C vLLM stops the engine itself (so it reads as errored too) and hands back
            # uvicorn's Server.shutdown; after its watchdog saw the engine die it hands back a no-op coroutine.
            died = engine.errored and not _after_a_signal(shutdown)
        await shutdown
    finally:
        sock.close()
    if died:
        logger.error("The engine died; the server stopped and exits with status %d.", ENGINE_DIED)
        return ENGINE_DIED
    return 0


def _after_a_signal(shutdown: Any) -> bool:
    """Whether vLLM's serve_http returned because SIGTERM or SIGINT asked it to stop."""
    return getattr(shutdown, "__qualname__", "").endswith("Server.shutdown")


def _interrupt_start(*_: Any) -> NoReturn:
    raise KeyboardInterrupt("terminated")


def _uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """The uvicorn settings vLLM's server derives from its serve arguments (entry.build_and_serve)."""
    from vllm import envs
    from vllm.entrypoints.launchers.utils.server_utils import get_uvicorn_log_config

    log_config = get_uvicorn_log_config(args)
    return {
        **({"log_config": log_config} if log_config is not None else {}),
        "enable_ssl_refresh": args.enable_ssl_refresh,
        "host": args.host,
        "port": args.port,
        "log_level": args.uvicorn_log_level,
        "access_log": not args.disable_uvicorn_access_log,
        "timeout_keep_alive": envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        "ssl_keyfile": args.ssl_keyfile,
        "ssl_certfile": args.ssl_certfile,
        "ssl_ca_certs": args.ssl_ca_certs,
        "ssl_cert_reqs": args.ssl_cert_reqs,
        "ssl_ciphers": args.ssl_ciphers,
        "h11_max_incomplete_event_size": args.h11_max_incomplete_event_size,
        "h11_max_header_count": args.h11_max_header_count,
    }
