"""Where one ingest's time goes, against what the machine's GEMM does on the model's own shapes.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/ingest_profile.py [--passages 520]

``profile_ingest`` takes a live in-process ``PoolingEngine`` and splits one ingest's wall time into tokenization,
the engine's steps (vLLM's scheduler and output processing, the runner's Python per step, and the ops of the
forward: GEMMs, attention, element-wise and other ops, from torch.profiler on the step thread) and the rest
(request submission, result gathering). Tokenization is timed on its own just before the ingest (it precedes the
first step), so under changing load the rest can come out negative. ``model_gemm_rate`` times the faster of
``F.linear`` and the kernel vLLM's CPU dispatch picks (the one the engine runs) on the model's own weight shapes at a
step's token count, in the engine's dtype: the rate the ingest's model FLOP/s is measured against.
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
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with the functions below
sys.path.insert(0, str(Path(__file__).resolve().parent))

# torch.profiler op names -> category; the first matching substring wins, unmatched ops are "other".
CATEGORIES = (
    # weight_packed_linear: the SGL kernel vLLM dispatches small bf16 weights to on AMX CPUs.
    (
        "gemm",
        (
            "aten::mm",
            "aten::addmm",
            "aten::bmm",
            "aten::baddbmm",
            "onednn_mm",
            "weight_packed_linear",
            "mkldnn",
            "aten::_mkl",
        ),
    ),
    ("attention", ("attention", "attn")),
    (
        "element-wise",
        (
            "gelu",
            "layer_norm",
            "rms_norm",
            "softmax",
            "aten::add",
            "aten::mul",
            "aten::div",
            "aten::sub",
            "aten::copy_",
            "aten::zero_",
            "aten::fill_",
            "aten::tanh",
            "aten::silu",
            "aten::where",
            "aten::clone",
            "aten::to",
            "aten::_to_copy",
            "aten::contiguous",
            "aten::embedding",
            "aten::index",
            "aten::rsqrt",
            "aten::pow",
            "aten::mean",
            "aten::sum",
            "aten::norm",
            "aten::clamp",
            "aten::cat",
            "aten::masked",
        ),
    ),
)


ATTENTION_OP = "unified_attention"


def category(name: str) -> str:
    for label, needles in CATEGORIES:
        if any(needle in name for needle in needles):
            return label
    return "other"


def model_shapes(path: Path) -> list[tuple[int, int]]:
    """(in, out) of one layer's matmul weights, as vLLM fuses them (qkv in one, gated MLPs' gate+up in one)."""
    config = json.loads((path / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv_heads = config.get("num_key_value_heads", heads)
    inter = config["intermediate_size"]
    gated = "qwen" in config.get("model_type", "")
    return [
        (hidden, head_dim * (heads + 2 * kv_heads)),
        (head_dim * heads, hidden),
        (hidden, inter * (2 if gated else 1)),
        (inter, hidden),
    ]


def model_gemm_rate(path: Path, dtype: str, tokens: int, repeats: int = 10) -> float:
    """FLOP/s of the machine's faster GEMM over one layer's weight shapes at ``tokens`` rows, in ``dtype``, all
    intra-op threads, the median of ``repeats`` passes over the layer: ``F.linear``, or the kernel vLLM's CPU
    dispatch gives each weight (oneDNN with the weight prepacked, SGL's AMX kernel for small weights), which the
    host engine runs and which is up to 1.2x faster in bf16 (1.6x in float32) on an AVX512_BF16 EPYC."""
    import statistics

    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    torch_dtype = getattr(torch, dtype)
    layers = []
    for k, n in model_shapes(path):
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(n, k, dtype=torch_dtype), requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        layers.append((torch.randn(tokens, k, dtype=torch_dtype), layer))
    flops = sum(2 * tokens * layer.weight.shape[0] * layer.weight.shape[1] for _, layer in layers)
    rates = []
    for linear in (
        lambda layer, x: torch.nn.functional.linear(x, layer.weight),
        lambda layer, x: layer.cpu_linear(x, layer.weight, None),
    ):
        seconds = []
        with torch.inference_mode():
            for i in range(repeats + 2):
                tic = time.perf_counter()
                for x, layer in layers:
                    linear(layer, x)
                if i >= 2:
                    seconds.append(time.perf_counter() - tic)
        rates.append(flops / statistics.median(seconds))
    return max(rates)


# -- inside the engine's worker (collective_rpc runs these on the step thread, where steps run) ------------------
def _start_profile(worker: Any) -> None:
    import torch

    runner = worker.model_runner
    timing = runner.bench_timing = {"execute_s": 0.0, "steps": 0}
    original = runner.execute_model

    def timed(scheduler_output, *args, **kwargs):
        tic = time.perf_counter()
        try:
            return original(scheduler_output, *args, **kwargs)
        finally:
            if scheduler_output.total_num_scheduled_tokens:
                timing["execute_s"] += time.perf_counter() - tic
                timing["steps"] += 1

    runner.execute_model = timed
    runner.bench_profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    runner.bench_profiler.__enter__()


def _stop_profile(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    runner.bench_profiler.__exit__(None, None, None)
    del runner.execute_model  # the class's method again
    ops: dict[str, float] = {}
    categories: dict[str, float] = {}
    for event in runner.bench_profiler.events():
        seconds = event.self_cpu_time_total / 1e6
        ops[event.name] = ops.get(event.name, 0.0) + seconds
        # Everything under vLLM's attention op is attention, whatever kernels it calls.
        parent, label = event, category(event.name)
        while parent is not None and label != "attention":
            label = "attention" if ATTENTION_OP in parent.name else label
            parent = parent.cpu_parent
        categories[label] = categories.get(label, 0.0) + seconds
    return {**runner.bench_timing, "ops_s": ops, "categories_s": categories}


def profile_ingest(engine: Any, texts: list[str]) -> dict[str, Any]:
    """One profiled ingest on a live in-process ``PoolingEngine`` (bundled or stock runner)."""
    vllm = engine._vllm
    if not hasattr(vllm, "_engine"):
        raise ValueError("profile_ingest needs an in-process engine (in_process=True).")
    core = vllm._engine
    step_seconds = [0.0]
    original_step = core.step

    def timed_step():
        tic = time.perf_counter()
        try:
            return original_step()
        finally:
            step_seconds[0] += time.perf_counter() - tic

    prefix = engine.family.document_prompt
    tic = time.perf_counter()
    engine.tokenizer.encode_texts(texts, prefix, "end")
    tokenize_s = time.perf_counter() - tic
    engine._loop.run(vllm.collective_rpc(_start_profile))
    core.step = timed_step
    try:
        tic = time.perf_counter()
        engine.embed(texts)
        wall_s = time.perf_counter() - tic
    finally:
        del core.step
        (inner,) = engine._loop.run(vllm.collective_rpc(_stop_profile))
    ops, by_category = inner.pop("ops_s"), inner.pop("categories_s")
    op_s = sum(ops.values())
    parts = {
        "tokenization": tokenize_s,
        **{f"ops: {label}": by_category.get(label, 0.0) for label in ("gemm", "attention", "element-wise", "other")},
        "runner Python per step": inner["execute_s"] - op_s,
        "scheduler and outputs": step_seconds[0] - inner["execute_s"],
        "rest (submission, results)": wall_s - tokenize_s - step_seconds[0],
    }
    top = sorted(ops.items(), key=lambda kv: -kv[1])[:12]
    return {"wall_s": wall_s, "steps": inner["steps"], "parts_s": parts, "top_ops_s": dict(top)}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def cpu_class() -> str:
    from rbln_retrieval import cpu_features

    return cpu_features.cpu_class()


def print_profile(label: str, profile: dict[str, Any]) -> None:
    wall = profile["wall_s"]
    print(f"{label}: {wall:.2f} s wall, {profile['steps']} steps")
    for part, seconds in profile["parts_s"].items():
        print(f"  {part:<28} {seconds:7.3f} s  {100 * seconds / wall:5.1f}%")
    print("  top ops (self time): " + ", ".join(f"{k} {v:.2f}" for k, v in profile["top_ops_s"].items()))


def main() -> None:
    from models import corpus, flops_per_token, minilm_path

    from rbln_retrieval import PoolingEngine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=520)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--runner", default="bundled")
    parser.add_argument("--kernels", default=None, help="bundled runner's kernels setting")
    args = parser.parse_args()
    path, texts = minilm_path(), corpus(args.passages)
    extra = {"additional_config": {"rbln_retrieval": {"kernels": args.kernels}}} if args.kernels else {}
    engine = PoolingEngine(
        path, device="cpu", dtype=args.dtype, runner=args.runner, max_length=args.max_length, engine_kwargs=extra
    )
    try:
        engine.embed(texts[:8])
        tokens = sum(len(t.ids) for t in engine.tokenizer.encode_texts(texts, engine.family.document_prompt))
        profile = profile_ingest(engine, texts)
        gemm_before = model_gemm_rate(path, args.dtype, 4096)
        tic = time.perf_counter()
        engine.embed(texts)
        plain_s = time.perf_counter() - tic
        gemm = (gemm_before + model_gemm_rate(path, args.dtype, 4096)) / 2  # the rate drifts: measured around it
    finally:
        engine.close()
    model_flops = tokens / plain_s * flops_per_token(path, tokens / len(texts))
    print(f"CPU: {cpu_name()} ({cpu_class()}), {os.cpu_count()} CPUs; load {os.getloadavg()}")
    print_profile(f"{args.runner} {args.kernels or ''} {args.dtype}, profiled", profile)
    print(
        f"unprofiled: {len(texts) / plain_s:.1f} passages/s, model {model_flops / 1e9:.1f} GFLOP/s; "
        f"GEMM on the model's shapes {gemm / 1e9:.1f} GFLOP/s; efficiency {model_flops / gemm:.2f}"
    )


if __name__ == "__main__":
    main()
