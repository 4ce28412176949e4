"""`make bench`: rbln-retrieval against sentence-transformers and vLLM's stock runner, in one run.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/run.py [--quick]

Writes bench/results/results.json, results.md (the README's tables; also as results-<CPU class>.md, the latest run
per class), history/<date>-<CPU class>.json (every run) and PNG plots; the tables name the CPU and its class.
Systems run alternately within each workload and the medians of the repeats are reported, so load from elsewhere
hits all of them.
Workloads (see workloads.py): ingest, warm single-query latency against a bare torch forward, 1 x 100 rerank,
64 concurrent async callers against one sequential caller, cold start to the first vector, and padding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
# vllm-rbln (installed beside us, as on an NPU host) activates its platform on any bare vLLM import and needs
# rebel-compiler for it: the stock runner and the cold-start script import vLLM directly.
os.environ.setdefault("VLLM_PLUGINS", "")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest_profile
import models
import report
import workloads
from systems import specs

RESULTS = Path(__file__).resolve().parent / "results"
QUERY = "How do I catch an exception and raise a different one?"
FULL_STEP = 4096  # the bundled runner's default step budget: most of an ingest's steps have this many tokens


def best_dtype() -> str:
    from rbln_retrieval.local.engine_args import resolve_dtype

    return resolve_dtype("auto", "cpu")


def plan(tag: str) -> dict[str, dict[str, list[str]]]:
    """Which systems run which workload, per model (names from systems.specs)."""
    ours, stock, per_step = (
        f"rbln-retrieval bundled {tag}",
        f"rbln-retrieval stock runner {tag}",
        f"one request/step padded {tag}",
    )
    st_best = f"sentence-transformers {tag}"
    return {
        "minilm": {
            "ingest": [ours, "rbln-retrieval bundled fp32", stock, per_step, "sentence-transformers fp32", st_best],
            "query": [ours, stock, st_best],
            "cold": [ours, stock, st_best],
        },
        "bert-base": {"ingest": [ours, stock, "sentence-transformers fp32", st_best]},
        "qwen3-0.6b": {"ingest": [ours, stock, st_best]},
        "bert-base-ce": {"rerank": [ours, stock, "sentence-transformers fp32", st_best]},
    }


def build(names: list[str], table: dict, path: Path, cross_encoder: bool) -> dict:
    systems = {}
    for name in dict.fromkeys(names):
        print(f"  starting {name}", flush=True)
        systems[name] = table[name].build(path, cross_encoder)
    return systems


def run_model(key: str, work: dict[str, list[str]], args: argparse.Namespace, table: dict) -> dict:
    model = models.MODELS[key]
    path = model.path(args.model_dir)
    big = key == "qwen3-0.6b"
    texts = models.corpus(args.passages)
    out: dict = {"label": model.label, "path": str(path)}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    lengths = [min(len(ids), args.max_length) for ids in tokenizer(texts)["input_ids"]]
    out["corpus"] = {"passages": len(texts), "tokens": sum(lengths), "mean_tokens": sum(lengths) / len(lengths)}
    flops = models.flops_per_token(path, out["corpus"]["mean_tokens"])
    if "ingest" in work:
        print(f"{model.label}: ingest", flush=True)
        systems = build(work["ingest"], table, path, False)
        dtypes = sorted({table[name].dtype for name in work["ingest"] if table[name].kind == "rbln"})
        # The rate the model's FLOP/s are held against: the faster GEMM (F.linear or vLLM's CPU dispatch) on its
        # own weight shapes at a full step.
        gemm = {d: (lambda d=d: ingest_profile.model_gemm_rate(path, d, FULL_STEP)) for d in dtypes}
        try:
            rows, vectors, rates = workloads.ingest(
                systems, texts, 1 if big else args.repeats, out["corpus"]["tokens"], flops, gemm
            )
            out["model_gemm_gflops"] = {d: r / 1e9 for d, r in rates.items()}
            if key in args.profile.split(","):
                out["profile"] = {}
                for name in work["ingest"]:
                    if table[name].kind == "rbln" and "one request" not in name:
                        print(f"  profiling {name}", flush=True)
                        out["profile"][name] = ingest_profile.profile_ingest(systems[name].engine, texts)
        finally:
            for s in systems.values():
                s.close()
        reference = vectors.get("sentence-transformers fp32")
        ref_n = len(texts)
        if reference is None:  # a large model's fp32 reference on a subset (fp32 of the whole corpus takes long)
            ref_n = min(64, len(texts))
            ref = table["sentence-transformers fp32"].build(path, False)
            reference = ref.embed(texts[:ref_n])
        for name, row in rows.items():
            row["min_cosine_vs_fp32"] = workloads.min_cosine(vectors[name][:ref_n], reference)
            row["reference_passages"] = ref_n
        out["ingest"] = rows
    if "query" in work:
        print(f"{model.label}: query latency and concurrency", flush=True)
        queries = models.queries(args.queries)
        systems = build(work["query"], table, path, False)
        try:
            out["query"] = workloads.query_latency(systems, queries[:100])
            for dtype in dict.fromkeys([table[work["query"][0]].dtype, "float32"]):  # the floor: the faster one
                name = f"bare forward (torch {'bf16' if dtype == 'bfloat16' else 'fp32'})"
                out["query"][name] = workloads.bare_forward(path, dtype, queries[:100])
            out["concurrency"] = workloads.concurrency(systems[work["query"][0]], queries, args.callers)
        finally:
            for s in systems.values():
                s.close()
    if "rerank" in work:
        print(f"{model.label}: rerank 1 x {args.rerank_docs}", flush=True)
        systems = build(work["rerank"], table, path, True)
        try:
            out["rerank"] = workloads.rerank(systems, QUERY, texts[: args.rerank_docs], args.repeats)
        finally:
            for s in systems.values():
                s.close()
    if "cold" in work:
        print(f"{model.label}: cold start", flush=True)
        out["cold_start_s"], out["import_s"], out["engine_start_s"] = {}, {}, {}
        for _ in range(args.cold_repeats):
            for name in work["cold"]:
                seconds, import_seconds, engine_seconds = workloads.cold_start(table[name], path)
                out["cold_start_s"].setdefault(name, []).append(round(seconds, 2))
                if engine_seconds is not None and import_seconds is not None:
                    out["import_s"].setdefault(name, []).append(round(import_seconds, 2))
                    out["engine_start_s"].setdefault(name, []).append(round(engine_seconds, 2))
                print(
                    f"  cold start {name}: {seconds:.1f} s (imports {import_seconds or 0:.1f} s, engine after "
                    f"imports {engine_seconds or 0:.1f} s)"
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(models.MODELS))
    parser.add_argument("--passages", type=int, default=520)
    parser.add_argument("--max-length", type=int, default=256, help="the corpus's token count is capped here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--callers", type=int, default=64)
    parser.add_argument("--rerank-docs", type=int, default=100)
    parser.add_argument("--cold-repeats", type=int, default=2)
    parser.add_argument("--model-dir", type=Path, default=Path("/tmp/rbln-bench-models"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile", default="minilm", help="models whose ingest is also profiled (torch.profiler)")
    parser.add_argument("--quick", action="store_true", help="MiniLM only, fewer repeats: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.models, args.repeats, args.cold_repeats, args.queries = "minilm", 1, 1, 200
    dtype = best_dtype()
    tag = "bf16" if dtype == "bfloat16" else "fp32"
    table = specs(dtype)
    # bf16 is timed only where the CPU computes it natively: elsewhere it is emulated, minutes for one rate.
    args.gemm = {d: workloads.gemm_rate(d) for d in sorted({"float32", dtype})}
    started = time.time()
    results = {
        "machine": {
            "cpu": ingest_profile.cpu_name(),
            "cpu_class": ingest_profile.cpu_class(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "best_dtype": dtype,
            "load_at_start": os.getloadavg(),
            "gemm_gflops": {d: r / 1e9 for d, r in args.gemm.items()},
        },
        "settings": {k: v for k, v in vars(args).items() if k not in ("gemm", "model_dir", "out")},
        "models": {},
    }
    previous = args.out / "results.json"
    if args.models != parser.get_default("models") and previous.is_file():
        # A run of some models updates their entries and keeps the others'.
        results["models"] = json.loads(previous.read_text())["models"]
    todo = plan(tag)
    for key in args.models.split(","):
        results["models"][key] = run_model(key, todo[key], args, table)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    results["wall_seconds"] = time.time() - started
    results["machine"]["load_at_end"] = os.getloadavg()
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    markdown = report.markdown(results, tag)
    (args.out / "results.md").write_text(markdown)
    # The latest run per CPU class (the README's tables for that class) and every run's figures, by date and class.
    cpu_class = results["machine"]["cpu_class"]
    (args.out / f"results-{cpu_class}.md").write_text(markdown)
    history = args.out / "history"
    history.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime(started))
    (history / f"{stamp}-{cpu_class}.json").write_text(json.dumps(results, indent=1, default=str))
    report.plots(results, args.out)
    print(markdown)


if __name__ == "__main__":
    main()
