"""The benchmark's models and corpus.

Models: all-MiniLM-L6-v2 (real weights) and random-weight checkpoints with the real architectures and sizes of
BERT-base (bi-encoder, mean pooling), a BERT-base cross-encoder and Qwen3-Embedding-0.6B. Random weights make
speed and numerics meaningful, not relevance; they borrow all-MiniLM-L6-v2's tokenizer (built once, cached).

Corpus: the Python documentation's topic pages shipped with CPython (``pydoc_data.topics``, PSF license),
consecutive paragraphs of one topic grouped 1 to 6 at a time: mixed-length real English passages.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The embedded MiniLM's path and the random-weight model builders live with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from model_builders import BERT_BASE, QWEN3_0_6B, build_bert_base_shaped, build_qwen3_shaped, minilm_path


def corpus(n: int, seed: int = 0) -> list[str]:
    import pydoc_data.topics

    rng = random.Random(seed)
    passages = []
    for topic in sorted(pydoc_data.topics.topics):
        paragraphs = [" ".join(p.split()) for p in pydoc_data.topics.topics[topic].split("\n\n")]
        paragraphs = [p for p in paragraphs if len(p.split()) >= 3 and not set(p) <= set("*=-~ ")]
        while paragraphs:
            take = rng.randint(1, 6)
            passages.append(" ".join(paragraphs[:take]))
            paragraphs = paragraphs[take:]
    rng.shuffle(passages)
    if len(passages) < n:
        raise SystemExit(f"The corpus has {len(passages)} passages, fewer than {n}.")
    return passages[:n]


def queries(n: int, seed: int = 1) -> list[str]:
    """Short query-like strings: 5 to 12 consecutive words from corpus passages (n may exceed the corpus)."""
    rng = random.Random(seed)
    passages = corpus(500, seed)
    out = []
    for i in range(n):
        words = passages[i % len(passages)].split()
        start = rng.randrange(max(1, len(words) - 5))
        out.append(" ".join(words[start : start + rng.randint(5, 12)]))
    return out


def qwen3_shaped(root: Path) -> Path:
    """A Qwen3-Embedding-0.6B-shaped checkpoint with random bf16 weights (~1.2 GB)."""
    path = root / "qwen3-0.6b-shaped"
    if (path / "model.safetensors").exists():
        return path
    return build_qwen3_shaped(path, layers=QWEN3_0_6B["num_hidden_layers"], full_vocabulary=True)


def _bert_base(root: Path, name: str, cross_encoder: bool) -> Path:
    path = root / name
    if (path / "model.safetensors").exists():
        return path
    return build_bert_base_shaped(path, layers=BERT_BASE["num_hidden_layers"], cross_encoder=cross_encoder)


@dataclass(frozen=True)
class BenchModel:
    key: str
    label: str
    path: Callable[[Path], Path]
    cross_encoder: bool = False


def _minilm(_: Path) -> Path:
    return minilm_path()


MODELS = {
    m.key: m
    for m in (
        BenchModel("minilm", "all-MiniLM-L6-v2", _minilm),
        BenchModel("bert-base", "BERT-base-shaped (random)", lambda root: _bert_base(root, "bert-base-shaped", False)),
        BenchModel("qwen3-0.6b", "Qwen3-0.6B-shaped (random)", qwen3_shaped),
        BenchModel(
            "bert-base-ce",
            "BERT-base-shaped cross-encoder (random)",
            lambda root: _bert_base(root, "bert-base-cross-encoder", True),
            cross_encoder=True,
        ),
    )
}


def flops_per_token(path: Path, tokens_per_sequence: float) -> float:
    """Forward FLOPs per token: 2 x matmul weights (embeddings excluded) plus attention scores and values."""
    import json

    config = json.loads((path / "config.json").read_text())
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads", heads)
    inter = config["intermediate_size"]
    attention_proj = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o and k, v
    mlp = hidden * inter * (3 if "qwen" in config.get("model_type", "") else 2)  # gated MLPs have 3 matrices
    attention_scores = 2 * heads * head_dim * tokens_per_sequence  # QK^T and AV, per token
    return 2 * layers * (attention_proj + mlp + attention_scores)
