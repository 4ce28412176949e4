"""Ray Data bulk embedding on this host: steady-state passages/s of one and two actors (docs/scaling.md).

Each run embeds the benchmark corpus (bench/models.corpus) repeated ``--repeat`` times through
``rbln_retrieval.ray.embed_dataset``; the clock starts when the first batch comes out (every engine has started
and warmed up) and stops at the last, so engine starts are reported apart from throughput.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import models
import ray

from rbln_retrieval.ray import embed_dataset

RESULTS = Path(__file__).parent / "results" / "ray_actors.json"


def run(texts: list[str], actors: int, batch_size: int) -> dict:
    cpus = os.cpu_count() / actors  # every core goes to the pool; each actor's torch uses its share
    started = time.monotonic()
    first = last = None
    rows = after_first = 0
    ds = ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    for batch in embed_dataset(
        ds, str(models.minilm_path()), actors=actors, batch_size=batch_size, num_cpus=cpus
    ).iter_batches(batch_size=None):
        now = time.monotonic()
        if first is None:
            first = now
        else:
            after_first += len(batch["id"])
        rows, last = rows + len(batch["id"]), now
    assert rows == len(texts)
    rate = after_first / (last - first)
    return {
        "actors": actors,
        "num_cpus_per_actor": cpus,
        "passages": rows,
        "first_batch_s": first - started,
        "passages_per_s": rate,
        "per_actor_passages_per_s": rate / actors,
        "load_average_at_end": os.getloadavg(),
    }


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=4, help="corpus repeats (520 passages each)")
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    texts = models.corpus(520) * args.repeat
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    # Figures from a shared host mean little without the load they were measured under.
    results = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_average_at_start": os.getloadavg(), "runs": []}
    for actors in (1, 2):
        results["runs"].append(run(texts, actors, args.batch_size))
        print(json.dumps(results["runs"][-1]))
    ray.shutdown()
    results["load_average_at_end"] = os.getloadavg()
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
