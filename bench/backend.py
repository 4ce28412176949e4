"""Bundled runner vs vLLM's stock runner vs upstream-RBLN-style prefill (one request per step, padded).

Per 1,000 passages: compiled-graph launches (steps), useful/computed tokens and host throughput, on a
mixed-length corpus of real English text: the Python documentation's topic pages shipped with CPython
(``pydoc_data.topics``, PSF license), consecutive paragraphs of one topic grouped 1 to 6 at a time.
Models: all-MiniLM-L6-v2 (real weights; fp32, and bf16, the default on a CPU with bf16 instructions) and a
random-weight model with Qwen3-0.6B's architecture and sizes (weights are random, so only speed and counts mean
anything; it borrows all-MiniLM-L6-v2's tokenizer).

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/backend.py [--passages 520]

A CPU gains little from batching; the counts (launches, padded tokens) are what carry over to the NPU.
Stock steps are counted by wrapping the stock worker's execute_model through vLLM's collective_rpc (this needs
VLLM_ALLOW_INSECURE_SERIALIZATION=1, set here for the benchmark's own engines only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")  # vllm-rbln's platform needs rebel-compiler (see run.py)
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import upstream_prefill
from models import corpus, minilm_path, qwen3_shaped


def _install_step_counter(worker: Any) -> None:
    """Runs inside the stock engine's worker: count forward steps and their tokens (stock pads nothing)."""
    runner = worker.model_runner
    counts = runner.bench_counts = {"steps": 0, "useful_tokens": 0, "computed_tokens": 0}
    original = runner.execute_model

    def counted(scheduler_output, *args, **kwargs):
        if scheduler_output.total_num_scheduled_tokens:
            counts["steps"] += 1
            counts["useful_tokens"] += scheduler_output.total_num_scheduled_tokens
            counts["computed_tokens"] += scheduler_output.total_num_scheduled_tokens
        return original(scheduler_output, *args, **kwargs)

    runner.execute_model = counted


def _read_step_counter(worker: Any) -> dict[str, int]:
    counts = dict(worker.model_runner.bench_counts)
    worker.model_runner.bench_counts.update(steps=0, useful_tokens=0, computed_tokens=0)
    return counts


class Contender:
    """One engine configuration, started once and timed several times (best of the repeats is reported)."""

    def __init__(self, model: Path, runner: str, settings: dict[str, Any] | None, texts: list[str], **options: Any):
        from rbln_retrieval import PoolingEngine

        if settings is None:  # upstream's prefill
            extra = upstream_prefill.engine_kwargs(model, max_length=options.get("max_length"))
        else:
            extra = {"additional_config": {"rbln_retrieval": settings}} if runner == "bundled" else {}
        started = time.perf_counter()
        self.engine = PoolingEngine(model, device="cpu", runner=runner, engine_kwargs=extra, **options)
        self.start_seconds = time.perf_counter() - started
        self.runner, self.texts, self.seconds = runner, texts, []
        self.engine.embed(texts[:8])  # first-call overheads (tokenizer, connections) are not what we measure
        if runner == "stock":
            self.engine._loop.run(self.engine._vllm.collective_rpc(_install_step_counter))

    def run(self) -> None:
        before = self.engine.stats() if self.runner == "bundled" else None
        # vLLM's stock runner caches prefixes of causal models: each repeat must compute what new passages would.
        self.engine._loop.run(self.engine._vllm.reset_prefix_cache())
        tic = time.perf_counter()
        self.vectors = self.engine.embed(self.texts)
        self.seconds.append(time.perf_counter() - tic)
        if self.runner == "stock":
            (self.counts,) = self.engine._loop.run(self.engine._vllm.collective_rpc(_read_step_counter))
        else:
            after = self.engine.stats()
            self.counts = {k: after[k] - before[k] for k in ("steps", "useful_tokens", "computed_tokens")}

    def result(self) -> dict[str, Any]:
        n = len(self.texts)
        return {
            "steps_per_1000": self.counts["steps"] * 1000 / n,
            "useful_over_computed": self.counts["useful_tokens"] / self.counts["computed_tokens"],
            "passages_per_s": n / min(self.seconds),
            "all_passages_per_s": [round(n / s, 2) for s in self.seconds],
            "tokens": self.counts["useful_tokens"],
            "start_seconds": self.start_seconds,
        }


CONFIGS = {
    "bundled": ("bundled", {}),
    "bundled static kernels": ("bundled", {"kernels": "static"}),
    "stock vLLM": ("stock", {}),
    "one request/step padded (upstream RBLN)": ("bundled", None),  # bench/upstream_prefill.py
}


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=520)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--models", default="minilm,minilm-bf16,qwen3")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names from CONFIGS")
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/rbln-bench-models"))
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("backend_results.json"))
    args = parser.parse_args()

    texts = corpus(args.passages)
    models = {
        "minilm": ("all-MiniLM-L6-v2 (fp32)", minilm_path, "float32", list(CONFIGS)),
        "minilm-bf16": ("all-MiniLM-L6-v2 (bf16)", minilm_path, "bfloat16", ["bundled", "stock vLLM"]),
        "qwen3": (
            "Qwen3-0.6B-shaped, random (bf16)",
            lambda: qwen3_shaped(args.model_dir),
            "bfloat16",
            ["bundled", "stock vLLM", "one request/step padded (upstream RBLN)"],
        ),
    }
    rows = []
    for key in args.models.split(","):
        label, path_fn, dtype, configs = models[key]
        configs = [c for c in configs if c in args.configs.split(",")]
        path = path_fn()
        contenders = {}
        try:
            for name in configs:
                runner, settings = CONFIGS[name]
                contenders[name] = Contender(path, runner, settings, texts, dtype=dtype, max_length=args.max_length)
            # Interleaved repeats: load from other processes on this shared machine hits every contender alike.
            for _ in range(args.repeats):
                for name, contender in contenders.items():
                    contender.run()
                    print(f"{label} | {name} (so far): {json.dumps(contender.result())}", flush=True)
        finally:
            for contender in contenders.values():
                contender.engine.close()
        results = {}
        for name, contender in contenders.items():
            results[name] = {**contender.result(), "vectors": contender.vectors}
            print(
                f"{label} | {name}: " + json.dumps({k: v for k, v in results[name].items() if k != "vectors"}),
                flush=True,
            )
        reference = results["stock vLLM"]
        for name, r in results.items():
            drift = float(np.abs(r["vectors"] - reference["vectors"]).max())
            rows.append(
                {
                    "model": label,
                    "runner": name,
                    "steps_per_1000": round(r["steps_per_1000"], 1),
                    "useful_over_computed": round(r["useful_over_computed"], 3),
                    "passages_per_s": round(r["passages_per_s"], 1),
                    "x_stock": round(r["passages_per_s"] / reference["passages_per_s"], 2),
                    "max_abs_diff_vs_stock": drift,
                    "tokens": r["tokens"],
                }
            )
    args.out.write_text(json.dumps({"passages": args.passages, "max_length": args.max_length, "rows": rows}, indent=2))
    print(f"\n{args.passages} passages, max_length {args.max_length}, {os.cpu_count()} CPUs\n")
    print("| model | runner | steps / 1000 passages | useful / computed tokens | passages/s | x stock |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['runner']} | {r['steps_per_1000']} | {r['useful_over_computed']} "
            f"| {r['passages_per_s']} | {r['x_stock']} |"
        )


if __name__ == "__main__":
    main()
