"""results.json -> the markdown tables (README) and PNG plots."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any


def _ratio(value: float, base: float | None) -> str:
    return f"{value / base:.2f}x" if base else "-"


def _cpu_ratio(base: float | None, value: float | None) -> str:
    """How many times this system's CPU seconds sentence-transformers' best setting spends on the same ingest."""
    return f"{base / value:.2f}x" if base and value else "-"


def _number(value: float | None, digits: int) -> str:
    """Rows from runs before a column existed show "-"."""
    return f"{value:.{digits}f}" if value is not None else "-"


def _profile(label: str, profiles: dict[str, Any]) -> list[str]:
    """One profiled ingest per system: where the wall time went (bench/ingest_profile.py)."""
    names = list(profiles)
    # Systems label different parts (the GEMMs per module kind of their own model code): the union, "-" where absent.
    parts = list(dict.fromkeys(part for p in profiles.values() for part in p["parts_s"]))
    lines = [
        f"**Where one ingest's time goes: {label}** (torch.profiler on the engine's step thread; the profiler "
        "slows the ops a little; % of the profiled wall time)",
        "",
        "| part | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for part in parts:
        cells = [
            f"{100 * p['parts_s'][part] / p['wall_s']:.1f}%" if part in p["parts_s"] else "-" for p in profiles.values()
        ]
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    walls = [f"{p['wall_s']:.1f} s, {p['steps']}" for p in profiles.values()]
    lines.append("| wall, steps | " + " | ".join(walls) + " |")
    lines.append("")
    for name, p in profiles.items():
        top = ", ".join(f"`{op}` {seconds:.2f} s" for op, seconds in list(p["top_ops_s"].items())[:6])
        lines.append(f"- {name}, largest ops (self time): {top}")
    lines.append("")
    return lines


def markdown(results: dict[str, Any], tag: str) -> str:
    machine = results["machine"]
    gemm = machine["gemm_gflops"]
    load = " ".join(f"{x:.1f}" for x in machine.get("load_at_start", ()))
    lines = [
        f"{machine.get('cpu', '?')} ({machine.get('cpu_class', '?')}), {machine['cpus']} CPUs, {machine['platform']}, "
        f"load average {load} at the start; torch GEMM rate ([512 x 1024] @ [1024 x 4096]) measured in this run: "
        + ", ".join(f"{'bf16' if d == 'bfloat16' else 'fp32'} {r:.0f} GFLOP/s" for d, r in sorted(gemm.items()))
        + f". Medians of {results['settings']['repeats']} alternating repeats.",
        "",
    ]
    st_best = f"sentence-transformers {tag}"
    for model in results["models"].values():
        corpus = model["corpus"]
        if "ingest" in model:
            rates = ", ".join(f"{d} {r:.0f}" for d, r in model.get("model_gemm_gflops", {}).items())
            lines += [
                f"**Ingest: {model['label']}**, {corpus['passages']} passages, {corpus['tokens']} tokens "
                f"(mean {corpus['mean_tokens']:.0f}, capped at {results['settings']['max_length']}); GEMM on the "
                f"model's own weight shapes at a 4,096-token step, timed around every ingest (median): {rates} "
                "GFLOP/s; each ingest's efficiency is held against the rates timed right before and after it",
                "",
                "| system | passages/s | tokens/s | x ST best | min cosine vs fp32 | model GFLOP/s "
                "| / GEMM (model shapes) | CPU s | ST best's CPU s / this | steps / 1000 | useful / computed |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            base = model["ingest"].get(st_best, {}).get("passages_per_s")
            base_cpu = model["ingest"].get(st_best, {}).get("cpu_s")
            for name, row in model["ingest"].items():
                steps = f"{row['steps_per_1000']:.1f}" if "steps_per_1000" in row else "-"
                useful = f"{row['useful_over_computed']:.3f}" if "useful_over_computed" in row else "-"
                ref = (
                    ""
                    if row["reference_passages"] == corpus["passages"]
                    else f" ({row['reference_passages']} passages)"
                )
                lines.append(
                    f"| {name} | {row['passages_per_s']:.1f} | {row['tokens_per_s']:.0f} | "
                    f"{_ratio(row['passages_per_s'], base)} | {row['min_cosine_vs_fp32']:.5f}{ref} | "
                    f"{_number(row.get('model_gflops'), 1)} | {_number(row.get('gemm_efficiency'), 2)} | "
                    f"{_number(row.get('cpu_s'), 2)} | {_cpu_ratio(base_cpu, row.get('cpu_s'))} | {steps} | {useful} |"
                )
            lines.append("")
        if "profile" in model:
            lines += _profile(model["label"], model["profile"])
        if "query" in model:
            floor = min(row["p50_ms"] for name, row in model["query"].items() if name.startswith("bare forward"))
            lines += [
                f"**Warm single query: {model['label']}** (bare forward: tokenize, one transformers forward, "
                "pool, normalize; the ratio is against the faster dtype)",
                "",
                "| system | p50 ms | p99 ms | p50 / bare forward |",
                "|---|---|---|---|",
            ]
            for name, row in model["query"].items():
                lines.append(f"| {name} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['p50_ms'] / floor:.2f}x |")
            lines.append("")
        if "concurrency" in model:
            c = model["concurrency"]
            lines += [
                f"**{c['callers']} concurrent async callers, {c['queries']} queries** ({model['label']}, "
                f"{next(iter(model['query']))})",
                "",
                "| mode | queries/s | p50 ms | p99 ms | p99 / p50 |",
                "|---|---|---|---|---|",
                f"| one caller, sequential | {c['sequential_qps']:.0f} | {c['sequential']['p50_ms']:.2f} | "
                f"{c['sequential']['p99_ms']:.2f} | {c['sequential']['p99_ms'] / c['sequential']['p50_ms']:.2f} |",
                f"| {c['callers']} callers | {c['concurrent_qps']:.0f} ({c['speedup']:.2f}x) | "
                f"{c['concurrent']['p50_ms']:.2f} | {c['concurrent']['p99_ms']:.2f} | "
                f"{c['concurrent']['p99_ms'] / c['concurrent']['p50_ms']:.2f} |",
                "",
            ]
        if "rerank" in model:
            base = model["rerank"].get(st_best, {}).get("median_ms")
            lines += [
                f"**Rerank 1 x {results['settings']['rerank_docs']}: {model['label']}**",
                "",
                "| system | median ms | x faster than ST best |",
                "|---|---|---|",
            ]
            for name, row in model["rerank"].items():
                lines.append(f"| {name} | {row['median_ms']:.0f} | {_ratio(base, row['median_ms'])} |")
            lines.append("")
        if "cold_start_s" in model:
            lines += [
                f"**Cold start to first vector: {model['label']}** (fresh process, warm page cache; imports are the "
                "modules an engine start loads; the engine's own part is its construction after them)",
                "",
                "| system | median s | runs | imports, median s | engine's own part, median s |",
                "|---|---|---|---|---|",
            ]
            for name, runs in model["cold_start_s"].items():
                cells = []
                for key in ("import_s", "engine_start_s"):
                    part = model.get(key, {}).get(name)
                    cells.append(f"{statistics.median(part):.1f}" if part else "-")
                runs_cell = ", ".join(f"{r:.1f}" for r in runs)
                lines.append(f"| {name} | {statistics.median(runs):.1f} | {runs_cell} | {' | '.join(cells)} |")
            lines.append("")
    return "\n".join(lines)


def plots(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ingest = {m["label"]: m["ingest"] for m in results["models"].values() if "ingest" in m}
    if ingest:
        fig, axes = plt.subplots(1, len(ingest), figsize=(5 * len(ingest), 4.5), squeeze=False)
        for ax, (label, rows) in zip(axes[0], ingest.items()):
            names = list(rows)
            ax.barh(names, [rows[n]["passages_per_s"] for n in names], color="tab:blue")
            ax.set_title(label, fontsize=10)
            ax.set_xlabel("passages/s (higher is better)")
            ax.invert_yaxis()
            ax.tick_params(axis="y", labelsize=8)
        fig.tight_layout()
        fig.savefig(out / "ingest.png", dpi=110)
        plt.close(fig)
    latency = [(m["label"], m["query"]) for m in results["models"].values() if "query" in m]
    if latency:
        label, rows = latency[0]
        names = list(rows)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        y = range(len(names))
        ax.barh([i - 0.2 for i in y], [rows[n]["p50_ms"] for n in names], height=0.4, label="p50")
        ax.barh([i + 0.2 for i in y], [rows[n]["p99_ms"] for n in names], height=0.4, label="p99")
        ax.set_yticks(list(y), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("ms per single query (lower is better)")
        ax.set_title(f"Warm single query: {label}", fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "query_latency.png", dpi=110)
        plt.close(fig)
