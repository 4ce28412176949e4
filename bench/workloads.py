"""The workloads: each takes built systems, runs them alternately (load from elsewhere hits all alike) and
returns plain numbers. Medians of the repeats are what the report quotes."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from systems import RBLNSystem, Spec, System


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def cpu_seconds() -> float:
    """CPU seconds of this process and its live children (an engine core may run in one): the work an ingest
    costs, which a loaded machine stretches far less than wall time (with ``OMP_WAIT_POLICY=PASSIVE`` waiting
    threads sleep, so it counts no spinning)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total


def ingest(
    systems: dict[str, System],
    texts: list[str],
    repeats: int,
    tokens: int,
    flops_per_token: float,
    gemm: dict[str, Callable[[], float]] | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray], dict[str, float]]:
    """Embed the whole corpus ``repeats`` times per system, alternating systems between repeats. ``gemm``'s rate
    measurements (FLOP/s per dtype) run before every ingest and after the last; each ingest of a system in one of
    those dtypes is held against the mean of the rates right before and after it (these machines' GEMM rate drifts
    by tens of percent within minutes), and its ``gemm_efficiency`` is the median over runs. The rates' medians
    come back third."""
    gemm = gemm or {}
    samples: list[dict[str, float]] = []
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    cpu: dict[str, list[float]] = {name: [] for name in systems}
    efficiency: dict[str, list[float]] = {name: [] for name in systems}
    vectors: dict[str, np.ndarray] = {}
    counts: dict[str, dict[str, int]] = {}
    for system in systems.values():
        system.embed(texts[:8])  # first-call costs (tokenizer, oneDNN primitives) are not ingest
    if gemm:
        samples.append({dtype: measure() for dtype, measure in gemm.items()})
    for _ in range(repeats):
        for name, system in systems.items():
            system.forget_prefixes()
            before = system.counters()
            tic, cpu_tic = time.perf_counter(), cpu_seconds()
            vectors[name] = system.embed(texts)
            seconds[name].append(time.perf_counter() - tic)
            cpu[name].append(cpu_seconds() - cpu_tic)
            after = system.counters()
            if before is not None and after is not None:
                counts[name] = {k: after[k] - before[k] for k in after}
            if gemm:
                samples.append({dtype: measure() for dtype, measure in gemm.items()})
                if (dtype := system.spec.dtype) in gemm:
                    rate = (samples[-2][dtype] + samples[-1][dtype]) / 2
                    efficiency[name].append(tokens / seconds[name][-1] * flops_per_token / rate)
            print(f"  ingest {name}: {len(texts) / seconds[name][-1]:.1f} passages/s", flush=True)
    results = {}
    for name in systems:
        median = statistics.median(seconds[name])
        row: dict[str, Any] = {
            "passages_per_s": len(texts) / median,
            "tokens_per_s": tokens / median,
            "runs_passages_per_s": [round(len(texts) / s, 2) for s in seconds[name]],
            "model_gflops": tokens / median * flops_per_token / 1e9,
            "cpu_s": statistics.median(cpu[name]),
            "runs_cpu_s": [round(c, 2) for c in cpu[name]],
        }
        if efficiency[name]:
            row["gemm_efficiency"] = statistics.median(efficiency[name])
            row["runs_gemm_efficiency"] = [round(e, 3) for e in efficiency[name]]
        if name in counts:
            c = counts[name]
            row["steps_per_1000"] = c["steps"] * 1000 / len(texts)
            row["useful_over_computed"] = c["useful_tokens"] / c["computed_tokens"]
        results[name] = row
    rates = {dtype: statistics.median(sample[dtype] for sample in samples) for dtype in gemm}
    return results, vectors, rates


def min_cosine(vectors: np.ndarray, reference: np.ndarray) -> float:
    a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


def query_latency(systems: dict[str, System], queries: list[str], rounds: int = 2) -> dict[str, dict[str, float]]:
    """Warm single-query latency: each query embedded alone, systems alternating every ``len(queries)`` calls."""
    samples: dict[str, list[float]] = {name: [] for name in systems}
    for system in systems.values():
        for q in queries[:5]:
            system.embed_query(q)
    for _ in range(rounds):
        for name, system in systems.items():
            for q in queries:
                tic = time.perf_counter()
                system.embed_query(q)
                samples[name].append(time.perf_counter() - tic)
    return {name: _latency_row(s) for name, s in samples.items()}


def _latency_row(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {"p50_ms": statistics.median(ms), "p99_ms": _percentile(ms, 99), "calls": len(ms)}


def bare_forward(path: Path, dtype: str, queries: list[str], rounds: int = 2) -> dict[str, float]:
    """The floor for one query: tokenize, one transformers forward, mean pooling and normalization, in torch."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=getattr(torch, dtype)).eval()
    samples = []
    with torch.inference_mode():
        for i in range(rounds * len(queries) + 5):
            tic = time.perf_counter()
            batch = tokenizer([queries[i % len(queries)]], return_tensors="pt", truncation=True, max_length=256)
            hidden = model(**batch).last_hidden_state.float()
            mask = batch["attention_mask"].unsqueeze(-1).float()
            pooled = (hidden * mask).sum(1) / mask.sum(1)
            torch.nn.functional.normalize(pooled, dim=-1)
            if i >= 5:
                samples.append(time.perf_counter() - tic)
    return _latency_row(samples)


def rerank(systems: dict[str, System], query: str, documents: list[str], repeats: int) -> dict[str, dict[str, Any]]:
    """One query against ``documents``, scored; latency per call, systems alternating."""
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    scores: dict[str, list[float]] = {}
    for system in systems.values():
        system.score(query, documents[:4])
    for _ in range(repeats):
        for name, system in systems.items():
            tic = time.perf_counter()
            scores[name] = system.score(query, documents)
            seconds[name].append(time.perf_counter() - tic)
            print(f"  rerank {name}: {seconds[name][-1] * 1000:.0f} ms", flush=True)
    return {
        name: {
            "median_ms": statistics.median(s) * 1000,
            "runs_ms": [round(x * 1000, 1) for x in s],
            "scores": scores[name],
        }
        for name, s in seconds.items()
    }


def concurrency(system: RBLNSystem, queries: list[str], callers: int) -> dict[str, Any]:
    """``len(queries)`` single-query calls: one caller in sequence, then ``callers`` async callers at once."""
    tic = time.perf_counter()
    sequential = []
    for q in queries:
        t = time.perf_counter()
        system.embed_query(q)
        sequential.append(time.perf_counter() - t)
    sequential_seconds = time.perf_counter() - tic

    async def run() -> tuple[float, list[float]]:
        pending = list(queries)
        latencies: list[float] = []

        async def caller() -> None:
            while pending:
                q = pending.pop()
                t = time.perf_counter()
                await system.aembed_query(q)
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        return time.perf_counter() - start, latencies

    concurrent_seconds, latencies = asyncio.run(run())
    return {
        "queries": len(queries),
        "callers": callers,
        "sequential_qps": len(queries) / sequential_seconds,
        "sequential": _latency_row(sequential),
        "concurrent_qps": len(queries) / concurrent_seconds,
        "concurrent": _latency_row(latencies),
        "speedup": sequential_seconds / concurrent_seconds,
    }


COLD = """
import sys, json, time
spec = json.loads(sys.argv[1])
if spec["kind"] == "rbln":
    # The modules an engine start imports (vLLM and transformers load most of theirs lazily), timed apart from
    # the engine's own start.
    import torch, transformers, vllm
    import transformers.models.auto.auto_factory, vllm.config, vllm.v1.engine.llm_engine, vllm.v1.worker.cpu_worker
    import rbln_retrieval.backend.engine_core.model_runner, rbln_retrieval.local.inproc, rbln_retrieval.local.vllm_calls
    from rbln_retrieval import PoolingEngine
    print("IMPORTED", flush=True)
    tic = time.perf_counter()
    engine = PoolingEngine(sys.argv[2], device="cpu", dtype=spec["dtype"], **spec["options"])
    print("ENGINE-STARTED", time.perf_counter() - tic, flush=True)
    vector = engine.embed(["What is a first vector?"])[0]
else:
    import torch
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(sys.argv[2], device="cpu", model_kwargs={"torch_dtype": getattr(torch, spec["dtype"])})
    vector = model.encode(["What is a first vector?"])[0]
print("FIRST-VECTOR", len(vector), flush=True)
"""


def cold_start(spec: Spec, path: Path) -> tuple[float, float | None, float | None]:
    """Seconds from starting a fresh Python process to its first vector (imports, engine start and warmup), the
    imports' part and the engine's own part (construction after the imports); both None for
    sentence-transformers."""
    payload = json.dumps({"kind": spec.kind, "dtype": spec.dtype, "options": spec.options})
    tic = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", COLD, payload, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ.copy(),
    )
    engine_seconds = import_seconds = None
    for line in proc.stdout:
        if line.startswith("IMPORTED"):
            import_seconds = time.perf_counter() - tic
        if line.startswith("ENGINE-STARTED"):
            engine_seconds = float(line.split()[1])
        if line.startswith("FIRST-VECTOR"):
            seconds = time.perf_counter() - tic
            break
    else:
        proc.wait()
        raise RuntimeError(f"{spec.name}: the cold-start process exited ({proc.returncode}) without a vector.")
    proc.wait(timeout=120)
    return seconds, import_seconds, engine_seconds


def gemm_rate(dtype: str, n: int = 1024, repeats: int = 20) -> float:
    """This machine's torch GEMM rate in FLOP/s: [512 x n] @ [n x 4n], all intra-op threads."""
    import torch

    a = torch.randn(512, n, dtype=getattr(torch, dtype))
    b = torch.randn(n, 4 * n, dtype=getattr(torch, dtype))
    for _ in range(3):
        a @ b
    tic = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * 512 * n * 4 * n * repeats / (time.perf_counter() - tic)
