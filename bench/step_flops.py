"""What the NPU's static steps compute against what they use, per model shape, in three formulations:

- rows: this release's ``rows x width`` shapes with attention per row (the default on ``device="rbln"``);
- whole step: the previous release's token buckets, each one masked attention over the whole step (the host
  kernels' buckets and packing, each bucket's graph counted as one row of that many tokens, 16 and 32 as 64);
- upstream: vllm-rbln's prefill, one prompt per step padded to max_length.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/step_flops.py

FLOPs are counted by torch's flop counter on the graphs the runner builds (``stats()["graph_costs"]``): they do not
depend on the machine, so this runs the static kernels on the host. Useful FLOPs: each text alone at its exact
length through plain transformers. Writes bench/results/step_flops.json and prints a Markdown table.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")

# The shaped checkpoints, the corpus and the useful-FLOP count are the tests' (tests/backend/test_step_shapes.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import upstream_prefill
from corpus import mixed_length
from model_builders import build_bert_base_shaped, build_qwen3_shaped, minilm_path
from reference import useful_flops

RESULTS = Path(__file__).resolve().parent / "results"
ALIGN = 64
BUILDERS = {"bert-base-shaped": build_bert_base_shaped, "qwen3-0.6b-shaped": build_qwen3_shaped}


def shaped(kind: str, root: Path) -> Path:
    """MiniLM, or a two-layer checkpoint of a real model's widths (the FLOP ratios do not depend on depth)."""
    if kind == "all-MiniLM-L6-v2":
        return minilm_path()
    path = root / kind
    return path if (path / "config.json").is_file() else BUILDERS[kind](path)


def engine(path: Path, engine_kwargs: dict | None = None, **settings):
    from rbln_retrieval import PoolingEngine

    return PoolingEngine(
        path,
        device="cpu",
        dtype="float32",
        runner="bundled",
        strict_shapes=True,
        engine_kwargs=engine_kwargs or {"additional_config": {"rbln_retrieval": settings}},
    )


def measure(kind: str, root: Path, texts: list[str]) -> dict:
    path = shaped(kind, root)
    out: dict = {}
    with engine(path, kernels="static") as rows:
        rows.embed(texts)
        s = rows.stats()
        max_length = rows.family.tokens.max_length
        out["rows"] = {
            "computed": s["computed_flops"],
            "useful_tokens": s["useful_tokens"],
            "computed_tokens": s["computed_tokens"],
            "graphs": len(s["buckets"]),
            "steps": s["steps"],
            "largest_activation_mib": max(c["largest_activation"] for c in s["graph_costs"].values()) / 2**20,
        }
    with engine(path) as host:  # the previous release's buckets and token packing
        host.embed(texts)
        h = host.stats()
    width = {b: -(-b // ALIGN) * ALIGN for b in h["buckets"]}
    with engine(path, kernels="static", shapes=[[1, w] for w in sorted(set(width.values()))]) as whole:
        costs = whole.stats()["graph_costs"]
        largest = max(c["largest_activation"] for c in costs.values()) / 2**20
    out["whole step"] = {
        "computed": sum(costs[f"1x{width[int(b)]}"]["flops"] * n for b, n in h["steps_per_bucket"].items()),
        "useful_tokens": h["useful_tokens"],
        "computed_tokens": h["computed_tokens"],
        "graphs": len(h["buckets"]),
        "steps": h["steps"],
        "largest_activation_mib": largest,
    }
    upstream_kwargs = upstream_prefill.engine_kwargs(path, static=True, settings={"kernels": "static"})
    with engine(path, upstream_kwargs) as upstream:
        upstream.embed(texts)
        u = upstream.stats()
        out["upstream"] = {
            "computed": u["computed_flops"],
            "useful_tokens": u["useful_tokens"],
            "computed_tokens": u["computed_tokens"],
            "graphs": 1,
            "steps": u["steps"],
            "largest_activation_mib": max(c["largest_activation"] for c in u["graph_costs"].values()) / 2**20,
        }
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
    assert sum(lengths) == out["rows"]["useful_tokens"], "the reference's tokens are the engine's"
    useful = useful_flops(path, lengths)
    for row in out.values():
        row["useful"] = useful
        row["flop_ratio"] = useful / row["computed"]
        row["token_ratio"] = row["useful_tokens"] / row["computed_tokens"]
    return out


def main() -> None:
    texts = mixed_length(80)
    # Two-layer checkpoints of their own: bench/run.py keeps full-depth ones of the same names in the parent.
    root = Path(os.environ.get("RBLN_BENCH_MODELS", "/tmp/rbln-bench-models")) / "two-layer"
    results = {
        kind: measure(kind, root, texts) for kind in ("all-MiniLM-L6-v2", "bert-base-shaped", "qwen3-0.6b-shaped")
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "step_flops.json").write_text(json.dumps(results, indent=1))
    print(f"Useful/computed FLOPs (and tokens) of static steps, {len(texts)} mixed texts (tests/corpus.py mix):\n")
    print("| model | rows x width (this release) | whole-step attention (previous) | one prompt per step (upstream) |")
    print("|---|---|---|---|")
    for kind, rows in results.items():
        cells = [
            f"{r['flop_ratio']:.3f} ({r['token_ratio']:.3f}), {r['graphs']} graphs, {r['steps']} steps, "
            f"largest activation {r['largest_activation_mib']:.0f} MiB"
            for r in (rows["rows"], rows["whole step"], rows["upstream"])
        ]
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
