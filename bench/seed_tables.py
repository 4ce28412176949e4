"""The Markdown of bench/seed_side_by_side.py's figures: its tables in docs/rbln.md and its row in README.md.

Pure rendering of bench/results/seed_side_by_side.json (json and the standard library only), so that
tests/project/test_seed_tables.py can hold the docs to the recorded run without starting an engine. As a script it
prints what the recorded run renders:

    python bench/seed_tables.py [bench/results/seed_side_by_side.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "seed_side_by_side.json"
SYSTEMS = ("vllm-rbln 0.12", "rbln-retrieval")
README_FAMILY = "all-MiniLM-L6-v2"


def _quality(side: dict[str, Any]) -> str:
    if "min_cosine" in side:
        return f"{side['min_cosine']:.5f} ({side['min_cosine_cls_pooling']:.5f})"
    return f"{side['max_score_difference']:.1e}"


def _mflops(side: dict[str, Any], task: str) -> str:
    flops = side["flops_per_item"]
    return f"{flops[0] / 1e6:.1f} / {flops[1] / 1e6:.1f}" if task == "embed" else f"{mean(flops) / 1e6:.1f}"


def measured_table(measured: list[dict[str, Any]]) -> str:
    lines = [
        "| family | system | min cosine (against CLS pooling; score: max difference) "
        "| MFLOPs per passage / per query (score: per pair) | graphs compiled | requests per step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in measured:
        for system in SYSTEMS:
            side = row[system]
            steps = f"{side['requests_per_step']:.2f}"
            cells = [_quality(side), _mflops(side, row["task"]), str(side["graphs"]), steps]
            lines.append("| " + " | ".join([row["family"], system, *cells]) + " |")
    return "\n".join(lines)


def support_table(supported: list[dict[str, Any]]) -> str:
    lines = ["| family (architecture) | vllm-rbln 0.12 | rbln-retrieval |", "| --- | --- | --- |"]
    for row in supported:
        arch = ", ".join(row["architectures"] or [])
        lines.append(f"| {row['family']} ({arch}) | {'yes' if row['vllm-rbln 0.12'] else 'no'} | yes |")
    return "\n".join(lines)


def readme_row(measured: list[dict[str, Any]]) -> str:
    """The README comparison's row of figures: all-MiniLM-L6-v2's, ours with how many times fewer FLOPs."""
    row = next(r for r in measured if r["family"] == README_FAMILY)
    seed, ours = (row[system] for system in SYSTEMS)
    fewer = " / ".join(f"{s / o:.1f}x" for s, o in zip(seed["flops_per_item"], ours["flops_per_item"]))
    return (
        f"| {README_FAMILY}, mixed corpus: min cosine against sentence-transformers; MFLOPs per passage / per query; "
        f"requests per step "
        f"| {seed['min_cosine']:.5f} (CLS pooling forced; {seed['min_cosine_cls_pooling']:.5f} against CLS pooling); "
        f"{_mflops(seed, 'embed')}; {seed['requests_per_step']:.2f} "
        f"| {ours['min_cosine']:.5f}; {_mflops(ours, 'embed')} ({fewer} fewer); {ours['requests_per_step']:.2f} |"
    )


def markdown(result: dict[str, Any]) -> str:
    """Everything the docs take from one run: the measured table, the support table, the README row."""
    tables = [measured_table(result["measured"])]
    if result["supported"]:
        tables.append(support_table(result["supported"]))
    if any(r["family"] == README_FAMILY for r in result["measured"]):
        tables.append(readme_row(result["measured"]))
    return "\n\n".join(tables)


if __name__ == "__main__":
    print(markdown(json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else RESULTS).read_text())))
