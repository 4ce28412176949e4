"""rbln-retrieval: check the machine, embed or rerank texts from files or stdin, serve a model over HTTP.

    rbln-retrieval doctor
    rbln-retrieval embed [FILE ...|-] [-m MODEL] [-o vectors.npy] [--kind query] [--instruction TEXT]
        [--dimensions N] [--precision int8|uint8|binary|ubinary [--ranges R.npy | --calibration C.npy]]
    rbln-retrieval embed --images IMAGE ... -m MODEL [-o vectors.npy]     (image-text models)
    rbln-retrieval rerank --query TEXT [FILE ...|-] [-m MODEL] [--top-n N]
    rbln-retrieval serve [MODEL ... | --config models.toml] [--host H] [--port P] [--api-key KEY]
        [--max-concurrent-requests N] [--max-queued-tokens N] [--max-payload-bytes N] [-- VLLM_OPTION ...]
    rbln-retrieval compile MODEL --npu NAME

MODEL is a local model directory or a Hugging Face id (org/name or org/name@revision) resolved through the
Hugging Face cache (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN apply; --cache-folder overrides the cache).
embed defaults to all-MiniLM-L6-v2 and rerank to bge-reranker-base, as the Python classes do; serve takes its model,
device, dtype, port and API key from the environment when no flag names them (SERVE_ENV below).

Input is read as rbln_retrieval.text.files says (lines or JSONL). Errors print one line on stderr and exit with
status 1. After `--`, serve takes the vLLM serve options it honours (`--ssl-certfile`, `--uvicorn-log-level`, engine
options, ...; docs/serving.md).

May import: rbln_retrieval, errors, cpu_features, quiet, engines, models, text, local, server, backend, doctor
Engine libraries: none
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

from pydantic import BaseModel

from rbln_retrieval import __version__
from rbln_retrieval.engines.options import EngineOptions, SourceOptions
from rbln_retrieval.errors import RBLNRetrievalError
from rbln_retrieval.models.source import DEFAULT_EMBEDDING_MODEL, DEFAULT_RERANKER_MODEL
from rbln_retrieval.quiet import quiet_startup
from rbln_retrieval.server.limits import add_limit_arguments, limits_from_args
from rbln_retrieval.text.files import read_texts

PROG = "rbln-retrieval"
# serve's settings from the environment, as TEI's and vLLM's containers take them: a flag wins, then the first
# variable set (RBLN_MODEL, else TEI's MODEL_ID), then the default.
SERVE_ENV = {
    "model": ("RBLN_MODEL", "MODEL_ID"),
    "device": ("RBLN_DEVICE",),
    "dtype": ("RBLN_DTYPE",),
    "port": ("PORT",),
    "api_key": ("RBLN_API_KEY",),
}
SERVE_DEFAULTS = {"model": DEFAULT_EMBEDDING_MODEL, "port": 8000}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"formatter_class": _HelpFormatter, **kwargs})

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """Each option's default at the end of its help, unless it has none or the help already names it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def main(argv: Sequence[str] | None = None) -> int:
    quiet_startup()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser()
    # serve passes what follows `--` to vLLM's own parser (server/serve.py), which names any option it refuses.
    passthrough: list[str] = []
    if argv[:1] == ["serve"] and "--" in argv:
        argv, passthrough = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    if argv and argv[0] in commands:
        # Intermixed: options may come after the input files ("rerank a.txt --query Q").
        args = commands[argv[0]].parse_intermixed_args(argv[1:])
    else:
        args = parser.parse_args(argv)  # --help, --version, or a usage error naming the commands
    args.vllm_args = passthrough
    if "default_model" in args:
        args.model = _model_of(args)
    try:
        return int(args.run(args))
    except (RBLNRetrievalError, ValueError, TypeError, OSError) as exc:
        # OSError covers missing or unreadable files; every message we raise is already one sentence.
        if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
            message = f"{exc.filename}: {exc.strerror}."
        else:
            message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> tuple[_Parser, dict[str, _Parser]]:
    parser = _Parser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=_Parser)

    doctor = commands.add_parser("doctor", help="versions, CPU features, RBLN runtime and device, what 'auto' picks")
    doctor.add_argument(
        "--graphs", metavar="MODEL", help="also start MODEL and print what each bucket graph calls (on --device)"
    )
    _option(doctor, "device")
    doctor.set_defaults(run=_doctor)

    embed = commands.add_parser("embed", help="texts to vectors (.npy, or JSONL on stdout)")
    _input_arguments(embed)
    _model_arguments(embed, default=DEFAULT_EMBEDDING_MODEL)
    embed.add_argument("-o", "--output", type=Path, help="write vectors here: .npy, else JSONL (default: stdout)")
    embed.add_argument(
        "--kind",
        choices=("document", "query"),
        default="document",
        help="embed the texts as documents or as queries (query: applies the model's query prompt)",
    )
    # embed's --query was a switch (rerank's takes the query); kept for one release as a deprecated --kind query.
    embed.add_argument("--query", action="store_true", dest="query_switch", help=argparse.SUPPRESS)
    embed.add_argument(
        "--instruction", help="replace the model's prompt (an instruction-taking model's queries: the task)"
    )
    embed.add_argument("--dimensions", type=int, help="matryoshka size (models trained for it: docs/models.md)")
    embed.add_argument(
        "--precision",
        choices=("float32", "int8", "uint8", "binary", "ubinary"),
        default="float32",
        help="quantize the vectors as sentence-transformers' quantize_embeddings does (see docs/quantization.md)",
    )
    embed.add_argument("--ranges", type=Path, help="int8/uint8: a .npy of shape (2, dim), per-dimension min and max")
    embed.add_argument("--calibration", type=Path, help="int8/uint8: a .npy of float vectors (n, dim) for ranges")
    embed.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    embed.add_argument("--images", action="store_true", help="FILEs are images, one each, for an image-text model")
    embed.set_defaults(run=_embed)

    rerank = commands.add_parser("rerank", help="rank texts by relevance to a query")
    rerank.add_argument("--query", required=True, help="the query to rank against")
    _input_arguments(rerank)
    _model_arguments(rerank, default=DEFAULT_RERANKER_MODEL)
    rerank.add_argument("--top-n", type=int, help="print only the best N (default: all)")
    rerank.add_argument("--instruction", help="a template reranker's task, or a bi-encoder's query prompt")
    rerank.add_argument("--jsonl", action="store_true", help='print {"index", "score", "text"} objects')
    rerank.set_defaults(run=_rerank)

    compile_ = commands.add_parser("compile", help="compile every bucket graph for an RBLN NPU, on a host without one")
    compile_.add_argument("model", help="local model directory, or a Hugging Face id (org/name[@revision])")
    _option(compile_, "revision", SourceOptions)
    _option(compile_, "cache_folder", SourceOptions)
    compile_.add_argument(
        "--npu",
        help="the NPU to compile for: RBLN-CA* (ATOM) or RBLN-CR* (Rebel100), e.g. RBLN-CA25 "
        "(default: $RBLN_FORCE_NPU_NAME)",
    )
    compile_.add_argument("--soc", help=argparse.SUPPRESS)  # deprecated name of --npu, kept one release
    _option(compile_, "dtype")
    _option(compile_, "max_length")
    _option(compile_, "trust_remote_code")
    compile_.set_defaults(run=_compile)

    serve = commands.add_parser(
        "serve",
        help="an HTTP server of the OpenAI, TEI, Cohere and Jina embedding and rerank routes",
        epilog="Options after `--` are vLLM's serve options this server honours (TLS, uvicorn's log level, request "
        "logging, media domains, engine options; docs/serving.md), e.g. "
        "`-- --ssl-keyfile key.pem --ssl-certfile cert.pem --uvicorn-log-level warning`.",
    )
    serve.add_argument(
        "model",
        nargs="*",
        help="local model directories or Hugging Face ids, each served under its own name (default: $RBLN_MODEL, "
        f"else $MODEL_ID, else {SERVE_DEFAULTS['model']})",
    )
    serve.add_argument("--config", type=Path, help="a TOML file of models with options and NPUs (docs/serving.md)")
    _model_arguments(serve, env=True)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, help=f"port to listen on (default: $PORT, else {SERVE_DEFAULTS['port']})")
    serve.add_argument("--api-key", help="require this bearer token (default: $RBLN_API_KEY)")
    add_limit_arguments(serve)
    serve.set_defaults(run=_serve)
    return parser, commands.choices


def _option(
    parser: argparse.ArgumentParser, name: str, declared: type[BaseModel] = EngineOptions, *, env: str = ""
) -> None:
    """The flag of an option declared in rbln_retrieval.engines.options: its type, choices, default and help from
    the declaration. ``env`` names the variable that serve reads when the flag is not given (its default is then
    None, resolved by ``_serve_setting``)."""
    field = declared.model_fields[name]
    flag = f"--{name.replace('_', '-')}"
    text = " ".join((field.description or "").replace("`", "").split()).replace("%", "%%")
    if field.annotation is bool:
        parser.add_argument(flag, action="store_true", help=text)
        return
    kinds = get_args(field.annotation)
    choices = kinds if get_origin(field.annotation) is Literal else None
    default = field.get_default(call_default_factory=True)
    if env:
        text = f"{text} (default: ${env}, else {default})"
        default = None
    if int in kinds:
        parser.add_argument(flag, type=int, default=default, help=text)
    else:
        parser.add_argument(flag, choices=choices, default=default, help=text)


def _model_arguments(parser: argparse.ArgumentParser, *, default: str = "", env: bool = False) -> None:
    if default:
        parser.add_argument(
            "-m",
            "--model",
            dest="model",
            help=f"local model directory, or a Hugging Face id (org/name[@revision]) (default: {default})",
        )
        parser.set_defaults(default_model=default)
    _option(parser, "revision", SourceOptions)
    _option(parser, "cache_folder", SourceOptions)
    _option(parser, "device", env="RBLN_DEVICE" if env else "")
    _option(parser, "dtype", env="RBLN_DTYPE" if env else "")
    _option(parser, "runner")
    _option(parser, "max_length")
    parser.add_argument(
        "--truncate",
        choices=("end", "start", "error", "chunk"),
        default="end",
        help="what happens to inputs over the limit (chunk: windows, combined; see docs/long-documents.md)",
    )
    parser.add_argument(
        "--chunk-overlap", type=int, help="tokens each window shares with the previous (--truncate chunk)"
    )
    _option(parser, "trust_remote_code")


def _input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", default=[], metavar="FILE", help="input files; '-' or none reads stdin")
    parser.add_argument(
        "--format",
        choices=("auto", "lines", "jsonl"),
        default="auto",
        help="input format (auto: JSONL for .jsonl/.ndjson files and JSON-object stdin)",
    )


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def _model_of(args: argparse.Namespace) -> str:
    """embed's and rerank's model: --model, else the command's default. The form of 0.1.0, the model as the first
    argument, still works for one release with a warning: a first FILE that is no file (a model directory or a
    Hugging Face id) is the model when --model is not given."""
    if args.model is None and args.files and args.files[0] != "-" and not Path(args.files[0]).is_file():
        args.model = args.files.pop(0)
        _warn(f"the model as the first argument is deprecated; use --model {args.model}")
    return str(args.model or args.default_model)


def _engine_options(args: argparse.Namespace) -> dict[str, Any]:
    # The hub token comes from HF_TOKEN (or `hf auth login`), never from a command line where `ps` would show it.
    return {
        "device": args.device,
        "dtype": args.dtype,
        "runner": args.runner,
        "max_length": args.max_length,
        "revision": args.revision,
        "cache_folder": args.cache_folder,
        "trust_remote_code": args.trust_remote_code,
    }


def _engine(args: argparse.Namespace) -> Any:
    from rbln_retrieval import PoolingEngine

    # truncate is the embed and rerank commands' own policy; a server truncates as each request asks.
    return PoolingEngine(args.model, truncate=_truncate(args), **_engine_options(args))


def _truncate(args: argparse.Namespace) -> Any:
    from rbln_retrieval import Chunk

    if args.chunk_overlap is None:
        return args.truncate
    if args.truncate != "chunk":
        raise ValueError(f"--chunk-overlap applies to --truncate chunk, not --truncate {args.truncate}.")
    return Chunk(overlap=args.chunk_overlap)


# -- commands --------------------------------------------------------------------------------------------------
def _embed(args: argparse.Namespace) -> int:
    import numpy as np

    if args.query_switch:
        _warn("embed's --query is deprecated; use --kind query")
        args.kind = "query"
    texts = [] if args.images else read_texts(args.files, args.format)
    if args.output is not None and not args.output.parent.is_dir():
        raise FileNotFoundError(f"{args.output.parent} does not exist; cannot write {args.output}.")
    if args.images:
        images = _image_files(args)
        with _engine(args) as engine:
            vectors = engine.embed_images(images, show_progress=not args.no_progress)
        return _write_vectors(args.output, vectors)
    # Refused here, before the engine starts, rather than by embed after 10-25 s of startup.
    if args.precision.endswith("int8") and (args.ranges is None) == (args.calibration is None):
        raise ValueError(f"--precision {args.precision} needs either --ranges or --calibration (a .npy file).")
    if not args.precision.endswith("int8") and (args.ranges or args.calibration):
        raise ValueError(f"--ranges and --calibration apply to --precision int8 or uint8, not {args.precision}.")
    ranges = np.load(args.ranges) if args.ranges else None
    calibration = np.load(args.calibration) if args.calibration else None
    with _engine(args) as engine:
        vectors = engine.embed(
            texts,
            kind=args.kind,
            instruction=args.instruction,
            dimensions=args.dimensions,
            show_progress=not args.no_progress,
            precision=args.precision,
            ranges=ranges,
            calibration_embeddings=calibration,
        )
    return _write_vectors(args.output, vectors)


def _image_files(args: argparse.Namespace) -> list[Path]:
    """--images: the FILE arguments as image paths (stdin holds no image), refused before the engine starts when
    an option for texts is given too."""
    text_options = {
        "--kind query": args.kind == "query",
        "--instruction": args.instruction is not None,
        "--dimensions": args.dimensions is not None,
        "--precision": args.precision != "float32",
    }
    if given := [name for name, set_ in text_options.items() if set_]:
        raise ValueError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to texts, not to --images.")
    if not args.files or "-" in args.files:
        raise ValueError("--images takes image files as arguments (not stdin).")
    return [Path(name) for name in args.files]


def _write_vectors(output: Path | None, vectors: Any) -> int:
    import numpy as np

    if output is not None and output.suffix == ".npy":
        np.save(output, vectors)
        return 0
    out = output.open("w", encoding="utf-8") if output is not None else sys.stdout
    try:
        for index, row in enumerate(vectors):
            out.write(json.dumps({"index": index, "embedding": row.tolist()}) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _rerank(args: argparse.Namespace) -> int:
    texts = read_texts(args.files, args.format)
    with _engine(args) as engine:
        ranked = engine.rerank(args.query, texts, top_n=args.top_n, instruction=args.instruction)
    for index, score in ranked:
        if args.jsonl:
            print(json.dumps({"index": index, "score": score, "text": texts[index]}))
        else:
            print(f"{score:.4f}\t{texts[index]}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    from rbln_retrieval.server.config import served_models
    from rbln_retrieval.server.serve import serve

    args.model = served_models(args.config, args.model)
    for name in SERVE_ENV:
        setattr(args, name, _serve_setting(args, name))
    return serve(
        args.model,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        limits=limits_from_args(args),
        vllm_args=args.vllm_args,
        **_engine_options(args),
    )


def _serve_setting(args: argparse.Namespace, name: str) -> Any:
    """serve's ``name``: its flag, else the first of its variables (SERVE_ENV) that is set, else the default; a
    variable's value is checked as the flag's would be, and refused in one sentence naming the variable."""
    declared = EngineOptions.model_fields.get(name)
    variable, value = next(((v, os.environ[v]) for v in SERVE_ENV[name] if os.environ.get(v)), ("", None))
    if getattr(args, name) not in (None, []) or value is None:  # serve without MODEL: the environment's model
        given = getattr(args, name)
        return given if given not in (None, []) else declared.default if declared else SERVE_DEFAULTS.get(name)
    if declared and value not in (choices := get_args(declared.annotation)):
        raise ValueError(f"{variable}={value!r} is not one of {', '.join(choices)}.")
    if name == "port" and (not value.isdigit() or not 0 < int(value) < 65536):
        raise ValueError(f"{variable}={value!r} is not a port number (1-65535).")
    return int(value) if name == "port" else value


def _compile(args: argparse.Namespace) -> int:
    """vllm-rbln's compile-only mode: the artifacts for ``--npu``'s family (ATOM: one .rbln per bucket graph;
    Rebel100: rebel's compile bundle) serve an NPU host's start with the same model, options and SDK."""
    from rbln_retrieval import PoolingEngine, backend

    if args.soc:
        _warn("compile's --soc is deprecated; use --npu")
    npu = args.npu or args.soc or backend.forced_npu_name()
    if not npu:
        raise ValueError(
            f"Name the NPU to compile for with --npu (e.g. RBLN-CA25 or RBLN-CR13) or {backend.FORCE_NPU_ENV}."
        )
    with PoolingEngine(
        args.model,
        device="rbln",
        dtype=args.dtype,
        max_length=args.max_length,
        revision=args.revision,
        cache_folder=args.cache_folder,
        trust_remote_code=args.trust_remote_code,
        engine_kwargs=backend.compile_only_settings(npu),
    ) as engine:
        stats = engine.stats()
    print(
        f"compiled {stats['compiles']} bucket graphs (rows x width: {', '.join(map(str, stats['buckets']))}) "
        f"for {stats['npu']} ({stats['route']}) into {stats['compile_cache']['dir']}"
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from rbln_retrieval.doctor import report

    return report(args.graphs, args.device)


if __name__ == "__main__":
    sys.exit(main())
