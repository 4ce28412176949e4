"""Read a `make test` timeline (``pytest --timeline=PATH``, tests/timeline.py) and say where the wall time went: each
worker's busy and waiting seconds, the tail one worker ran alone, the cores' busy share over the run, and the files
that held a worker longest.

    PYTEST_ARGS="--timeline=/tmp/timeline.jsonl" make test
    python bench/suite_timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path)
    parser.add_argument("--top", type=int, default=15, help="files to list")
    args = parser.parse_args()
    phases: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    session: float | None = None
    for line in args.timeline.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if "session" in record:
            session = record["session"]
        else:
            (samples if "cpu" in record else phases).append(record)
    if not phases:
        raise SystemExit(f"{args.timeline} holds no test phase")
    begin = min(p["start"] for p in phases)
    end = max(p["stop"] for p in phases)
    started = f" ({begin - session:,.0f} s after the session's start: collection, workers' start)" if session else ""
    print(f"wall {end - begin:,.0f} s from the first test's setup to the last test's teardown{started}")
    by_worker: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for phase in phases:
        by_worker[phase["worker"]].append(phase)
    finished = []
    for worker, own in sorted(by_worker.items()):
        busy = sum(p["stop"] - p["start"] for p in own)
        last = max(p["stop"] for p in own)
        finished.append(last)
        waited = last - min(p["start"] for p in own) - busy
        print(f"{worker}: in tests {busy:,.0f} s, between them {waited:,.0f} s, done at +{last - begin:,.0f} s")
    if len(finished) > 1:
        print(f"tail: {end - min(finished):,.0f} s after the first worker finished")
    if samples:
        cores = [s["cpu"] for s in samples if begin <= s["at"] <= end]
        if cores:
            below = sum(c < 1.5 for c in cores) / len(cores)
            print(
                f"cores busy: mean {statistics.fmean(cores):.2f}, median {statistics.median(cores):.2f}; "
                f"{below:.0%} of {len(cores)} samples under 1.5; load median "
                f"{statistics.median(s['load'] for s in samples):.1f}"
            )
    per_file: dict[tuple[str, str], float] = defaultdict(float)
    for phase in phases:
        per_file[(phase["test"].split("::")[0], phase["worker"])] += phase["stop"] - phase["start"]
    print("files holding a worker longest (s):")
    for (path, worker), seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {seconds:7,.0f}  {worker}  {path}")


if __name__ == "__main__":
    main()
