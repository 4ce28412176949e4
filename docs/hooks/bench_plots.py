"""MkDocs hook: publish the plots `make bench` writes to bench/results/ as benchmarks/plots/*.png, so the benchmarks
page shows the committed plots without a copy of them under docs/."""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

PLOTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def on_files(files: Files, config) -> Files:
    for plot in sorted(PLOTS.glob("*.png")):
        files.append(File.generated(config, f"benchmarks/plots/{plot.name}", abs_src_path=str(plot)))
    return files
