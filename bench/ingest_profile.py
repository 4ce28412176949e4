"""Where one ingest's time goes, against what the machine's GEMM does on the model's own shapes.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/ingest_profile.py [--passages 520]

``profile_ingest`` takes a live in-process ``PoolingEngine`` and splits one ingest's wall time by stage:
tokenization (timed on its own just before the ingest, which it precedes, so under changing load the rest can come
out negative), vLLM's scheduler and output processing, and, from torch.profiler on the step thread, the runner's
stages (``RUNNER_STAGES``: packing the step's inputs and attention metadata, pooling, copying results out) and the
model's ops: the GEMMs per module kind (``gemm: model.encoder.layer.*.intermediate``, the layer index starred so
that the layers add up; a GEMM with a fused epilogue carries its GELU or residual add), attention (everything
under vLLM's attention op), element-wise and other ops, and the modules' own Python. ``model_gemm_rate`` times the
fastest of ``F.linear``, the kernel vLLM's CPU dispatch picks and oneDNN's linear on a packed weight on the
model's own weight shapes at a step's token count, in the engine's dtype: the rate the ingest's model FLOP/s is
measured against; ``single_shape_rate`` the same on the MLP's up-projection alone.
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
            "CompiledFxGraph",  # Inductor's generated kernels in a compiled model (its GEMMs are separate calls)
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
    """FLOP/s of the machine's fastest GEMM over one layer's weight shapes at ``tokens`` rows, in ``dtype``."""
    return gemm_rate_on(model_shapes(path), dtype, tokens, repeats)


def single_shape_rate(path: Path, dtype: str, tokens: int, repeats: int = 10) -> float:
    """The same rate on one shape, the model's MLP up-projection (4096 x 384 x 1536 for MiniLM at a full step)."""
    return gemm_rate_on(model_shapes(path)[2:3], dtype, tokens, repeats)


def gemm_rate_on(shapes: list[tuple[int, int]], dtype: str, tokens: int, repeats: int = 10) -> float:
    """FLOP/s of the machine's fastest GEMM over ``shapes`` ((in, out) weights) at ``tokens`` rows, in ``dtype``,
    all intra-op threads, the median of ``repeats`` passes: ``F.linear``, the kernel vLLM's CPU dispatch gives
    each weight (oneDNN with the weight prepacked, SGL's AMX kernel for small weights; up to 1.2x ``F.linear`` in
    bf16, 1.6x in float32 on an AVX512_BF16 EPYC), or oneDNN's linear on a weight packed for it (what the host
    layers run on AMX in bf16, graph.host_layers)."""
    import statistics

    import torch
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    torch_dtype = getattr(torch, dtype)
    layers = []
    for k, n in shapes:
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(torch.randn(n, k, dtype=torch_dtype), requires_grad=False)
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        layer.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight, tokens)
        layers.append((torch.randn(tokens, k, dtype=torch_dtype), layer))
    flops = sum(2 * tokens * layer.weight.shape[0] * layer.weight.shape[1] for _, layer in layers)
    rates = []
    for linear in (
        lambda layer, x: torch.nn.functional.linear(x, layer.weight),
        lambda layer, x: layer.cpu_linear(x, layer.weight, None),
        lambda layer, x: torch.ops.mkldnn._linear_pointwise(x, layer.onednn_weight, None, "none", [], ""),
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
# The runner's methods per step, labelled for the profile by the stage they belong to; the innermost label of an op
# names its stage. Ops inside the model are labelled by their innermost module instead (``module: ...``).
RUNNER_STAGES = {
    "_update_states": "pack",
    "_prepare_inputs": "pack",
    "_build_attention_metadata": "pack",
    "_preprocess": "pack",
    "_model_forward": "pack",  # the bundled runner's layout and pooling weights; the graph below is labelled apart
    "_graph": "pooling",  # the bundled runner's forward and pooling; the model inside it carries module labels
    "_pool": "copies out",
}
STAGE, MODULE = "stage: ", "module: "


def _labelled(fn: Any, label: str) -> Any:
    import torch

    def run(*args, **kwargs):
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return run


def _label_modules(model: Any) -> list[Any]:
    """Forward hooks that open a profiler label per module call (``module: encoder.layer.*.output``, the layer
    index starred so that the model's layers add up per kind); returns the hook handles."""
    import re

    import torch

    handles, open_labels = [], []

    def enter(label: str):
        def hook(module, args):
            scope = torch.profiler.record_function(label)
            scope.__enter__()
            open_labels.append(scope)

        return hook

    def leave(module, args, output):
        open_labels.pop().__exit__(None, None, None)

    for name, module in model.named_modules():
        if name:
            label = MODULE + re.sub(r"\.\d+(\.|$)", r".*\1", name)
            handles.append(module.register_forward_pre_hook(enter(label)))
            handles.append(module.register_forward_hook(leave))
    return handles


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
    # Instance attributes (the bundled runner's ``_graph``) are put back as they were, methods by deleting the label.
    runner.bench_labelled = {m: runner.__dict__.get(m) for m in RUNNER_STAGES if hasattr(runner, m)}
    # Module labels only where the model runs eagerly (the bundled runner untraced): hooks added to a compiled model
    # (vLLM's stock runner, traced buckets) would make dynamo recompile it. There the forward is one "model" stage.
    bundled = getattr(runner, "bundled", None)
    eager = bundled is not None and not bundled.traced
    for method in runner.bench_labelled:
        stage = RUNNER_STAGES[method] if eager or method != "_model_forward" else "model"
        setattr(runner, method, _labelled(getattr(runner, method), STAGE + stage))
    runner.bench_hooks = _label_modules(runner.model) if eager else []
    runner.bench_profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    runner.bench_profiler.__enter__()


def stage_of(event: Any) -> str:
    """An op's part of the step: its op category inside the model (GEMMs per module kind), else its stage."""
    label = category(event.name)
    parent = event
    while parent is not None:
        if ATTENTION_OP in parent.name:
            return "attention"
        if parent.name.startswith(MODULE):
            if parent is event:
                return "model Python (module calls)"
            if label == "gemm":
                return f"gemm: {parent.name[len(MODULE) :]}"
            return label if label != "other" else "other ops"
        if parent.name.startswith(STAGE):
            stage = parent.name[len(STAGE) :]
            if stage == "model":  # a compiled model, unlabelled: its ops by category, GEMMs together
                return "gemm: every module" if label == "gemm" else label if label != "other" else "other ops"
            return stage
        parent = parent.cpu_parent
    return "runner, outside the stages"


def _stop_profile(worker: Any) -> dict[str, Any]:
    runner = worker.model_runner
    runner.bench_profiler.__exit__(None, None, None)
    del runner.execute_model  # the class's method again
    for method, own in runner.bench_labelled.items():
        if own is None:
            delattr(runner, method)
        else:
            setattr(runner, method, own)
    for handle in runner.bench_hooks:
        handle.remove()
    ops: dict[str, float] = {}
    stages: dict[str, float] = {}
    for event in runner.bench_profiler.events():
        seconds = event.self_cpu_time_total / 1e6
        if not event.name.startswith((STAGE, MODULE)):
            ops[event.name] = ops.get(event.name, 0.0) + seconds
        stage = stage_of(event)
        stages[stage] = stages.get(stage, 0.0) + seconds
    return {**runner.bench_timing, "ops_s": ops, "stages_s": stages}


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

    prefix = engine.family.prompt.document_prompt
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
    ops, stages = inner.pop("ops_s"), inner.pop("stages_s")
    gemms = {k: v for k, v in sorted(stages.items()) if k.startswith("gemm")}
    named = ("attention", "element-wise", "other ops", "model Python (module calls)", "pack", "pooling", "copies out")
    parts = {
        "tokenization": tokenize_s,
        "schedule (vLLM's scheduler, outputs)": step_seconds[0] - inner["execute_s"],
        **{label: stages.get(label, 0.0) for label in named[4:5]},
        **gemms,
        **{label: stages.get(label, 0.0) for label in (*named[:4], *named[5:])},
        "runner Python outside the stages": inner["execute_s"]
        - sum(stages.values())
        + stages.get("runner, outside the stages", 0.0),
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
        tokens = sum(len(t.ids) for t in engine.tokenizer.encode_texts(texts, engine.family.prompt.document_prompt))
        profile = profile_ingest(engine, texts)
        gemm_before = model_gemm_rate(path, args.dtype, 4096)
        tic = time.perf_counter()
        engine.embed(texts)
        plain_s = time.perf_counter() - tic
        gemm = (gemm_before + model_gemm_rate(path, args.dtype, 4096)) / 2  # the rate drifts: measured around it
        single = single_shape_rate(path, args.dtype, 4096)
    finally:
        engine.close()
    model_flops = tokens / plain_s * flops_per_token(path, tokens / len(texts))
    print(f"CPU: {cpu_name()} ({cpu_class()}), {os.cpu_count()} CPUs; load {os.getloadavg()}")
    print_profile(f"{args.runner} {args.kernels or ''} {args.dtype}, profiled", profile)
    print(
        f"unprofiled: {len(texts) / plain_s:.1f} passages/s, model {model_flops / 1e9:.1f} GFLOP/s; "
        f"GEMM on the model's shapes {gemm / 1e9:.1f} GFLOP/s (on its MLP up-projection alone {single / 1e9:.1f}); "
        f"efficiency {model_flops / gemm:.2f}"
    )


if __name__ == "__main__":
    main()
