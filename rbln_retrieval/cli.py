"""rbln-retrieval: check the machine, embed or rerank texts from files or stdin, serve a model over HTTP.

    rbln-retrieval doctor
    rbln-retrieval embed MODEL [FILE ...|-] [-o vectors.npy] [--query] [--instruction TEXT] [--dimensions N]
        [--precision int8|uint8|binary|ubinary [--ranges R.npy | --calibration C.npy]]
    rbln-retrieval embed MODEL --images IMAGE ... [-o vectors.npy]     (image-text models: CLIP, SigLIP)
    rbln-retrieval rerank MODEL --query TEXT [FILE ...|-] [--top-n N]
    rbln-retrieval serve MODEL [MODEL ...] [--host H] [--port P] [--api-key KEY] [--max-concurrent-requests N]
        [--max-queued-tokens N] [--max-payload-bytes N] [-- VLLM_OPTION ...]

MODEL is a local model directory or a Hugging Face id (org/name or org/name@revision) resolved through the
Hugging Face cache (HF_HOME, HF_HUB_CACHE, HF_HUB_OFFLINE and HF_TOKEN apply; --cache-folder overrides the cache).

Input is one text per line (blank lines are skipped) or JSONL objects with a "text" field: files ending in
.jsonl/.ndjson are JSONL, and so is stdin when its first non-blank line is a JSON object (`--format` decides
otherwise). Errors print one line on stderr and exit with status 1. After `--`, serve takes the vLLM serve options it
honours (`--ssl-certfile`, `--uvicorn-log-level`, `--enable-log-requests`, engine options, ...; docs/serving.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from rbln_retrieval.errors import RBLNRetrievalError
from rbln_retrieval.quiet import quiet_startup
from rbln_retrieval.server.limits import add_limit_arguments, limits_from_args

PROG = "rbln-retrieval"
JSONL_SUFFIXES = (".jsonl", ".ndjson")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv: Sequence[str] | None = None) -> int:
    quiet_startup()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parser()
    # serve passes what follows `--` to vLLM's own parser (server/serve.py), which names any option it refuses.
    passthrough: list[str] = []
    if argv[:1] == ["serve"] and "--" in argv:
        argv, passthrough = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    if argv and argv[0] in commands:
        # Intermixed: options may come after the input files ("rerank MODEL a.txt --query Q").
        args = commands[argv[0]].parse_intermixed_args(argv[1:])
    else:
        args = parser.parse_args(argv)  # --help, or a usage error naming the commands
    args.vllm_args = passthrough
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
    commands = parser.add_subparsers(required=True, metavar="COMMAND", parser_class=_Parser)

    doctor = commands.add_parser("doctor", help="versions, CPU features, RBLN runtime and device, what 'auto' picks")
    doctor.add_argument(
        "--graphs", metavar="MODEL", help="also start MODEL and print what each bucket graph calls (on --device)"
    )
    doctor.add_argument("--device", choices=("auto", "rbln", "cpu"), default="auto")
    doctor.set_defaults(run=_doctor)

    embed = commands.add_parser("embed", help="texts to vectors (.npy, or JSONL on stdout)")
    _model_arguments(embed)
    _input_arguments(embed)
    embed.add_argument(
        "-o", "--output", type=Path, help="write vectors here: .npy, anything else JSONL (default: stdout)"
    )
    embed.add_argument("--query", action="store_true", help="embed the texts as queries (applies the query prompt)")
    embed.add_argument("--instruction", help="replace the model's prompt (Qwen3-Embedding queries: the task)")
    embed.add_argument("--dimensions", type=int, help="matryoshka size (Qwen3-Embedding, Nomic, EmbeddingGemma)")
    embed.add_argument(
        "--precision",
        choices=("float32", "int8", "uint8", "binary", "ubinary"),
        default="float32",
        help="quantize the vectors as sentence-transformers' quantize_embeddings does (see docs/quantization.md)",
    )
    embed.add_argument("--ranges", type=Path, help="int8/uint8: a .npy of shape (2, dim), per-dimension min and max")
    embed.add_argument(
        "--calibration", type=Path, help="int8/uint8: a .npy of float vectors (n, dim) to take ranges of"
    )
    embed.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    embed.add_argument(
        "--images", action="store_true", help="FILEs are images, one each, for an image-text model (CLIP, SigLIP)"
    )
    embed.set_defaults(run=_embed)

    rerank = commands.add_parser("rerank", help="rank texts by relevance to a query")
    _model_arguments(rerank)
    rerank.add_argument("--query", required=True, help="the query to rank against")
    _input_arguments(rerank)
    rerank.add_argument("--top-n", type=int, help="print only the best N (default: all)")
    rerank.add_argument("--instruction", help="Qwen3-Reranker task, or a bi-encoder's query prompt")
    rerank.add_argument("--jsonl", action="store_true", help='print {"index", "score", "text"} objects')
    rerank.set_defaults(run=_rerank)

    compile_ = commands.add_parser(
        "compile", help="compile and cache every bucket graph for an RBLN NPU, on a host without one"
    )
    compile_.add_argument("model", help="local model directory, or a Hugging Face id (org/name[@revision])")
    compile_.add_argument("--revision", help="branch, tag or commit of a Hugging Face id (default: main)")
    compile_.add_argument("--cache-folder", help="Hugging Face cache to resolve ids in (default: HF_HUB_CACHE)")
    compile_.add_argument(
        "--npu",
        help="the NPU to compile for: RBLN-CA* (ATOM) or RBLN-CR* (Rebel100), e.g. RBLN-CA25 "
        "(default: $RBLN_FORCE_NPU_NAME)",
    )
    compile_.add_argument("--soc", help=argparse.SUPPRESS)  # deprecated name of --npu
    compile_.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    compile_.add_argument("--max-length", type=int, help="tokens per input (default: the model's limit)")
    compile_.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run code shipped with the model (GTE-new and Nomic config classes); off by default",
    )
    compile_.set_defaults(run=_compile)

    serve = commands.add_parser(
        "serve",
        help="an HTTP server of the OpenAI, TEI, Cohere and Jina embedding and rerank routes",
        epilog="Options after `--` are vLLM's serve options this server honours (TLS, uvicorn's log level, request "
        "logging, media domains, engine options; docs/serving.md), e.g. "
        "`-- --ssl-keyfile key.pem --ssl-certfile cert.pem --uvicorn-log-level warning`.",
    )
    _model_arguments(serve, several=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--api-key", default=os.environ.get("RBLN_API_KEY"), help="require this bearer token (default: $RBLN_API_KEY)"
    )
    add_limit_arguments(serve)
    serve.set_defaults(run=_serve)
    return parser, commands.choices


def _model_arguments(parser: argparse.ArgumentParser, *, several: bool = False) -> None:
    if several:  # serve: each request names its model (`model`), or the only one able to answer its route
        parser.add_argument(
            "model", nargs="+", help="local model directories or Hugging Face ids, each served under its own name"
        )
    else:
        parser.add_argument("model", help="local model directory, or a Hugging Face id (org/name[@revision])")
    parser.add_argument("--revision", help="branch, tag or commit of a Hugging Face id (default: main)")
    parser.add_argument("--cache-folder", help="Hugging Face cache to resolve ids in (default: HF_HUB_CACHE)")
    parser.add_argument("--device", choices=("auto", "rbln", "cpu"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    parser.add_argument(
        "--runner",
        choices=("bundled", "stock"),
        default="bundled",
        help="bundled backend (default) or vLLM's stock CPU runner",
    )
    parser.add_argument("--max-length", type=int, help="tokens per input (default: the model's limit)")
    parser.add_argument(
        "--truncate",
        choices=("end", "start", "error", "chunk"),
        default="end",
        help="what happens to inputs over the limit (chunk: windows, combined; see docs/long-documents.md)",
    )
    parser.add_argument(
        "--chunk-overlap", type=int, help="tokens each window shares with the previous (--truncate chunk)"
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run code shipped with the model (GTE-new and Nomic config classes); off by default",
    )


def _input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="*", default=[], metavar="FILE", help="input files; '-' or none reads stdin")
    parser.add_argument(
        "--format",
        choices=("auto", "lines", "jsonl"),
        default="auto",
        help="input format (auto: JSONL for .jsonl/.ndjson files and JSON-object stdin)",
    )


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


# -- input -----------------------------------------------------------------------------------------------------
def read_texts(files: Sequence[str], fmt: str = "auto", stdin: TextIO | None = None) -> list[str]:
    """Texts from ``files`` ('-' or none: stdin) in order; raises ValueError naming the bad file and line."""
    texts: list[str] = []
    for name in files or ["-"]:
        if name == "-":
            texts.extend(_parse((stdin or sys.stdin).read().splitlines(), "stdin", fmt))
        else:
            path = Path(name)
            if path.is_dir():
                raise IsADirectoryError(f"{name} is a directory; pass text or JSONL files.")
            by_suffix = "jsonl" if path.suffix.lower() in JSONL_SUFFIXES else "lines"
            fmt_for_file = by_suffix if fmt == "auto" else fmt
            with path.open(encoding="utf-8") as handle:
                texts.extend(_parse(handle.read().splitlines(), name, fmt_for_file))
    return texts


def _parse(lines: list[str], name: str, fmt: str) -> Iterator[str]:
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if fmt == "auto":
        fmt = "jsonl" if numbered and _is_json_object(numbered[0][1]) else "lines"
    if fmt == "lines":
        yield from (line for _, line in numbered)
        return
    for n, line in numbered:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"line {n} of {name} is not valid JSON ({exc.msg}).") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(f'line {n} of {name} has no "text" string.')
        yield row["text"]


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


# -- commands --------------------------------------------------------------------------------------------------
def _embed(args: argparse.Namespace) -> int:
    import numpy as np

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
            kind="query" if args.query else "document",
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
        "--query": args.query,
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
    from rbln_retrieval.server.serve import serve

    return serve(
        args.model,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        limits=limits_from_args(args),
        vllm_args=args.vllm_args,
        **_engine_options(args),
    )


def _compile(args: argparse.Namespace) -> int:
    """vllm-rbln's compile-only mode: the artifacts for ``--npu``'s family (ATOM: one .rbln per bucket graph;
    Rebel100: rebel's compile bundle) serve an NPU host's start with the same model, options and SDK."""
    from rbln_retrieval import PoolingEngine
    from rbln_retrieval.backend.config import CONFIG_KEY
    from rbln_retrieval.backend.npu.rbln_runtime import FORCE_NPU_ENV, forced_npu_name

    if args.soc:
        print("rbln-retrieval compile: --soc is deprecated; use --npu", file=sys.stderr)
    npu = args.npu or args.soc or forced_npu_name()
    if not npu:
        raise ValueError(f"Name the NPU to compile for with --npu (e.g. RBLN-CA25 or RBLN-CR13) or {FORCE_NPU_ENV}.")
    settings = {"additional_config": {CONFIG_KEY: {"compile_only": True, "npu": npu}}}
    with PoolingEngine(
        args.model,
        device="rbln",
        dtype=args.dtype,
        max_length=args.max_length,
        revision=args.revision,
        cache_folder=args.cache_folder,
        trust_remote_code=args.trust_remote_code,
        engine_kwargs=settings,
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
