"""Padding on many small synchronous calls (issue #16): the step buckets and the packing scheduler's budget choice
against the previous defaults, both engines in one process, the same calls alternating between them.

The workload: calls of 1 to 100 texts, each text a short query (3-15 words) or a passage (20-200 words) of the
Python documentation, submitted one call at a time. Reported: useful/computed tokens, steps per call, graphs.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/small_calls.py [--calls 60]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")  # vllm-rbln's platform needs rebel-compiler (see run.py)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from models import corpus, minilm_path

# Before issue #16: powers of two to 1,024, then steps of 1,024; every step's budget the largest bucket (a step
# cost this large makes the scheduler prefer the fullest step, as first-fit into the largest bucket did).
PREVIOUS = {"buckets": [16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096], "step_cost_tokens": 10**9}
CURRENT: dict = {}


def calls(count: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    words = " ".join(corpus(520)).split()

    def text() -> str:
        size = rng.randint(3, 15) if rng.random() < 0.5 else rng.randint(20, 200)
        start = rng.randrange(len(words) - size)
        return " ".join(words[start : start + size])

    return [[text() for _ in range(rng.randint(1, 100))] for _ in range(count)]


def main() -> None:
    from rbln_retrieval import PoolingEngine

    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=60)
    args = parser.parse_args()
    workload = calls(args.calls)
    engines = {
        name: PoolingEngine(
            minilm_path(),
            device="cpu",
            dtype="float32",
            engine_kwargs={"additional_config": {"rbln_retrieval": settings}},
        )
        for name, settings in (("previous", PREVIOUS), ("current", CURRENT))
    }
    before = {name: engine.stats() for name, engine in engines.items()}
    seconds = dict.fromkeys(engines, 0.0)
    for texts in workload:
        for name, engine in engines.items():
            tic = time.perf_counter()
            engine.embed(texts)
            seconds[name] += time.perf_counter() - tic
    rows = {}
    for name, engine in engines.items():
        after = engine.stats()
        useful = after["useful_tokens"] - before[name]["useful_tokens"]
        computed = after["computed_tokens"] - before[name]["computed_tokens"]
        steps = after["steps"] - before[name]["steps"]
        rows[name] = {
            "graphs": len(after["buckets"]),
            "useful_over_computed": round(useful / computed, 3),
            "steps_per_call": round(steps / len(workload), 2),
            "seconds": round(seconds[name], 1),
        }
        engine.close()
    print(json.dumps({"calls": len(workload), "texts": sum(map(len, workload)), **rows}, indent=1))


if __name__ == "__main__":
    main()
