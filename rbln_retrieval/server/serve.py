"""`rbln-retrieval serve`: the package's own HTTP server (app.py's route table) over a PoolingEngine with the bundled
backend and the family's presets.

The server runs one PoolingEngine (vLLM's engine in its own process, so a dead engine is seen, not shared) and
app.py's app on uvicorn: the routes of the OpenAI, TEI, Cohere v2 and Jina dialects and the package's own (the
description on DESCRIBE_PATH, quantized vectors, token-level outputs), each mapped onto the engine's API, so a remote
result equals a local one. It shuts down cleanly on SIGTERM and exits ENGINE_DIED when the engine died under it (a
watchdog polls the engine), so a supervisor restarts it. Backpressure (limits.py) bounds the requests in flight,
the tokens they queue, a request's size and its upload time, and the description advertises those bounds.

Options after `--` are parsed by vLLM's own serve parser, as they always were: the frontend options this server
honours (HONOURED: TLS, uvicorn's log level and access log, request-id headers, request logging, the media domains
it may fetch from, h11's limits) keep their meaning; vLLM's engine options (``--max-num-seqs``, ...) reach the
engine; any other (vLLM's chat, tool and tracing options, ...) is refused naming it, as is an option we set from the
presets given another value.

Imports: backend, engines (options, protocol), local (device, engine, engine_args), models, quiet, server (app,
config, limits, media, served); vLLM's argument parser and uvicorn inside the functions that build and run the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Sequence
from typing import Any, NoReturn

from rbln_retrieval import backend
from rbln_retrieval.engines.options import EngineOptions, LocalModel, local_model
from rbln_retrieval.engines.protocol import OUTPUTS_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.local.device import resolve_device
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.files import unreadable_weights, weights_fingerprint
from rbln_retrieval.models.source import SOURCE_ARGS
from rbln_retrieval.quiet import quiet_vllm
from rbln_retrieval.server.config import ModelEntry, model_entry
from rbln_retrieval.server.limits import Limits

logger = logging.getLogger(__name__)

# serve()'s exit code when the engine died under the server (1 is the CLI's for errors before it starts).
ENGINE_DIED = 3
# How often the watchdog looks at the engine.
WATCHDOG_SECONDS = 1.0
# vLLM's frontend options this server honours; every other non-default frontend option is refused.
HONOURED = frozenset(
    {
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
        "ssl_cert_reqs",
        "ssl_ciphers",
        "uvicorn_log_level",
        "disable_uvicorn_access_log",
        "enable_request_id_headers",
        "enable_log_requests",
        "allowed_media_domains",
        "h11_max_incomplete_event_size",
        "root_path",
    }
)
# Engine options serve sets itself from its own options and the presets: given another value after `--`, refused.
OURS = frozenset(
    {
        "host",
        "port",
        "api_key",
        "model",
        "model_tag",
        "served_model_name",
        "dtype",
        "max_model_len",
        "trust_remote_code",
        "runner",
    }
)


def describe(
    model: str, family: ModelFamily, limits: Limits | None = None, weights: str | None = None
) -> dict[str, Any]:
    """What GET DESCRIBE_PATH answers: every field of the family, which RemoteEngine turns back into it, the
    server's limits, under which it splits its calls, and the served weights' fingerprint (models/files.py)."""
    return {
        "model": model,
        "family": family.fields(),
        "quantized_embeddings": QUANTIZED_EMBED_PATH,
        "outputs": OUTPUTS_PATH,
        "limits": (limits or Limits()).advertised(),
        "weights": weights,
    }


@dataclasses.dataclass(frozen=True)
class ServerSetup:
    """What a server of one model runs: its frontend arguments (vLLM's parsed serve arguments: ``model``,
    ``served_model_name``, host, port, TLS, ...), the backend target (None: stock), the body of GET DESCRIBE_PATH
    and the PoolingEngine's resolved model (vLLM engine options after `--` among its options' ``engine_kwargs``)."""

    args: argparse.Namespace
    target: str | None
    description: dict[str, Any]
    engine: LocalModel
    limits: Limits = dataclasses.field(default_factory=Limits)
    """The bounds the model is served under: the server's, tightened by its config entry's."""


def server_args(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    vllm_args: Sequence[str] = (),
    **options: Any,
) -> tuple[argparse.Namespace, str | None]:
    """server_setup's frontend arguments and target for ``model`` (a directory or a Hugging Face id, resolved as
    PoolingEngine does). The server publishes the name it was started with: the repo id for a hub model (without
    ``@revision``), else the directory."""
    setup = server_setup(model, host=host, port=port, api_key=api_key, vllm_args=vllm_args, **options)
    return setup.args, setup.target


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
    """What a server of ``model`` runs under ``limits``; ``vllm_args`` are vLLM's serve options (``--ssl-certfile
    F``, ``--uvicorn-log-level warning``, ``--max-num-seqs N``, ...). vLLM's platform in this process is resolved
    here, under the target's plugin scope, before the first vLLM import (backend.pin_platform)."""
    options = dict(options)
    source_args = {name: options.pop(name) for name in SOURCE_ARGS if name in options}
    resolved = local_model(model, EngineOptions(**options), **source_args)
    source, opts, family = resolved.source, resolved.options, resolved.family
    if reason := unreadable_weights(source.path):  # before any model's engine starts, not after the others'
        raise ValueError(f"{model} cannot be served: {reason}")
    device = resolve_device(opts.device)
    target = opts.target(device)
    backend.pin_platform(target)  # before anything below imports vLLM
    quiet_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="rbln-retrieval serve MODEL --"))
    parser.error = _refuse_vllm_args  # type: ignore[method-assign]  # a sentence, not argparse's exit
    defaults, args = parser.parse_args([]), parser.parse_args(list(vllm_args))
    engine_fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    engine_kwargs = dict(opts.engine_kwargs)
    for name, value in vars(args).items():
        if value == getattr(defaults, name) or name in HONOURED:
            continue
        flag = "a model after `--`" if name == "model_tag" else "--" + name.replace("_", "-")
        if name in OURS or name in engine_kwargs:
            raise ValueError(
                f"{flag} is set by rbln-retrieval serve itself (from its own options and the model's presets); "
                "give it there, not among vLLM's options."
            )
        if name not in engine_fields:
            raise ValueError(
                f"{flag} is an option of vLLM's own server, which rbln-retrieval serve does not run (it serves "
                "its own route table: docs/serving.md)."
            )
        engine_kwargs[name] = value
    # The key travels in the namespace, never on a command line where `ps` would show it.
    for name, value in {
        "host": host,
        "port": port,
        "api_key": [api_key] if api_key else None,
        "served_model_name": [source.name],
        "model": source.path,
    }.items():
        setattr(args, name, value)
    # The server's engine runs in its own process: its death is seen (ENGINE_DIED), never shared with the server.
    in_process = {} if "in_process" in opts.model_fields_set else {"in_process": False}
    engine = dataclasses.replace(
        resolved, options=opts.model_copy(update={**in_process, "engine_kwargs": engine_kwargs})
    )
    description = describe(source.name, family, limits, weights_fingerprint(source.path))
    return ServerSetup(args, target, description, engine, limits or Limits())


def _refuse_vllm_args(message: str) -> NoReturn:
    raise ValueError(f"vLLM's server options were refused: {message}.")


def serve(
    model: str | Sequence[str | dict[str, Any] | ModelEntry],
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: Limits | dict[str, int | None] | None = None,
    vllm_args: Sequence[str] = (),
    **options: Any,
) -> int:
    """Run the server of ``model`` (one model, or several: each request names its own, served.py) in this process
    until SIGTERM or Ctrl-C; returns the exit code: 0 after a requested stop, ENGINE_DIED when an engine died under
    it, so that a supervisor restarts it. A model is a name, or an entry of a config file (config.py: a table or a
    ModelEntry) with options of its own over ``options``, the NPUs it runs on and limits of its own tightening
    ``limits``; each has its own engine. ``limits`` bound the requests in flight, their queued tokens, a request's
    size and its upload time (default: Limits()). A model that fails to start stops the server before it serves,
    naming it."""
    api_key = api_key or os.environ.get("RBLN_API_KEY")
    limits = as_limits(limits)
    entries, setups = entry_setups(model, limits, options, host=host, port=port, api_key=api_key, vllm_args=vllm_args)
    import uvloop

    # A SIGTERM while the engines start interrupts the start; once uvicorn runs, it stops the server cleanly.
    signal.signal(signal.SIGTERM, _interrupt_start)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the way to stop a foreground server
        sock = _bind(setups[0].args.host, setups[0].args.port)
        engines: list[Any] = []
        try:
            for entry, setup in zip(entries, setups, strict=True):
                # On the CPU every model shares the cores; on an NPU each runs on the NPUs named for it.
                with backend.activated(setup.target, entry.device_env() if setup.target == "rbln" else {}):
                    engines.append(_start_named(entry.model, setup, several=len(entries) > 1))
            code = uvloop.run(_run_server(engines, setups, limits, sock))
            if code == ENGINE_DIED:
                # The dead engine's client can block the interpreter's teardown (its sockets wait on a process that
                # is gone), so the process leaves at once with its code; a supervisor restarts it.
                logging.shutdown()
                os._exit(code)
            return code
        finally:
            for engine in engines:
                engine.close()
            sock.close()
    return 0


def as_limits(limits: Limits | dict[str, int | None] | None) -> Limits:
    """``limits`` as Limits (a mapping of its fields, or None: the defaults)."""
    return limits if isinstance(limits, Limits) else Limits(**(limits or {}))


def served_entries(model: str | os.PathLike[str] | Sequence[Any]) -> list[ModelEntry]:
    """What a server of ``model`` serves, one entry a model: one name, or several names or config entries (a table
    of a config file, or a ModelEntry); a bad entry is refused naming its number."""
    given = [model] if isinstance(model, str | os.PathLike) else list(model)
    return [
        model_entry(str(entry) if isinstance(entry, os.PathLike) else entry, f"model {number}")
        for number, entry in enumerate(given, 1)
    ]


def entry_setups(
    model: str | os.PathLike[str] | Sequence[Any], limits: Limits, options: dict[str, Any], **frontend: Any
) -> tuple[list[ModelEntry], list[ServerSetup]]:
    """The entries of ``model`` and the setup of each (its options over ``options``, its limits tightening
    ``limits``, ``frontend``: server_setup's host, port, key and vLLM options), for `serve` and a Ray Serve replica
    alike; a model served twice is refused."""
    entries = served_entries(model)
    setups = [
        server_setup(
            entry.model, limits=limits.tightened(entry.limits, entry.model), **frontend, **entry.options(options)
        )
        for entry in entries
    ]
    _refuse_twice_served([entry.model for entry in entries], setups)
    return entries, setups


def _refuse_twice_served(names: list[str], setups: list[ServerSetup]) -> None:
    served: dict[str, str] = {}
    for name, setup in zip(names, setups, strict=True):
        published = setup.args.served_model_name[0]
        if published in served:
            raise ValueError(f"{name} is served as {published!r}, as {served[published]} is: give each model once.")
        served[published] = name


def _start_named(model: str, setup: ServerSetup, *, several: bool) -> Any:
    """start_engine, its failure naming the model when the server has several."""
    try:
        return start_engine(setup)
    except Exception as error:
        if not several:
            raise
        raise ValueError(f"The model {model} did not start, so the server stops: {error}") from error


def start_engine(setup: ServerSetup) -> Any:
    """The PoolingEngine a server of ``setup`` runs."""
    from rbln_retrieval.local.engine import PoolingEngine

    return PoolingEngine(setup.engine)


def build_served_app(engines: Any, setups: Any, limits: Limits) -> Any:
    """app.py's app over ``engines`` as ``setups`` serve them (one engine and setup, or lists of each in the same
    order; the same for `serve` and a Ray Serve replica); the frontend settings are the first setup's."""
    from rbln_retrieval.server.app import build_app
    from rbln_retrieval.server.limits import Gate
    from rbln_retrieval.server.media import MediaCheck
    from rbln_retrieval.server.served import Served, ServedModels

    if isinstance(setups, ServerSetup):
        engines, setups = [engines], [setups]
    args = setups[0].args
    served = []
    for engine, setup in zip(engines, setups, strict=True):
        name = setup.args.served_model_name[0]
        # A model's own gate only where its entry tightened the server's bounds.
        gate = Gate(name, setup.limits) if setup.limits != limits else None
        served.append(Served(name, engine, setup.description, gate))
    models = ServedModels(served)
    return build_app(
        models,
        limits=limits,
        api_keys=args.api_key,
        media=MediaCheck(args.allowed_media_domains),
        request_id_headers=args.enable_request_id_headers,
        log_requests=args.enable_log_requests,
    )


async def _run_server(engines: list[Any], setups: list[ServerSetup], limits: Limits, sock: socket.socket) -> int:
    """uvicorn over the app, and a watchdog that stops it when an engine died."""
    import uvicorn

    app = build_served_app(engines, setups, limits)
    server = uvicorn.Server(uvicorn.Config(app, **_uvicorn_options(setups[0].args)))
    died: list[str] = []

    async def watchdog() -> None:
        while not server.should_exit:
            await asyncio.sleep(WATCHDOG_SECONDS)
            died.extend(str(engine.model) for engine in engines if engine.errored)
            if died:
                server.should_exit = True

    watching = asyncio.create_task(watchdog())
    try:
        await server.serve(sockets=[sock])
    finally:
        watching.cancel()
    if died:
        logger.error("The engine of %s died; the server stopped and exits with status %d.", died[0], ENGINE_DIED)
        return ENGINE_DIED
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """The server's listening socket, bound before the engine starts (a taken port fails at once)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _interrupt_start(*_: Any) -> NoReturn:
    raise KeyboardInterrupt("terminated")


def _uvicorn_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's settings from vLLM's frontend options (HONOURED)."""
    from vllm import envs

    options: dict[str, Any] = {
        "log_level": args.uvicorn_log_level,
        "access_log": not args.disable_uvicorn_access_log,
        "timeout_keep_alive": envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE,
        "ssl_keyfile": args.ssl_keyfile,
        "ssl_certfile": args.ssl_certfile,
        "ssl_ca_certs": args.ssl_ca_certs,
        "ssl_cert_reqs": args.ssl_cert_reqs,
        "ssl_ciphers": args.ssl_ciphers,
        "root_path": args.root_path or "",
    }
    if args.h11_max_incomplete_event_size is not None:
        options["h11_max_incomplete_event_size"] = args.h11_max_incomplete_event_size
    return options
