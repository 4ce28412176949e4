"""vllm-rbln 0.12's own pooling engine on the stand-in compiler, in a subprocess (test and bench helper, never
shipped): ``run(model, ops)`` starts ``vllm.LLM`` with only vllm-rbln's plugins loaded (``VLLM_PLUGINS``), as on an
NPU host (``REBEL_STANDIN_NPU`` mounts one stand-in NPU), with the stand-in (``tests/standin``) as rebel-compiler under
the SDK's rules (``REBEL_STANDIN_RULES=sdk``: Rebellions' graphs are judged by Rebellions' rules) and the test-only
torchvision import stub (``tests/standin/stubs``). Nothing of vllm-rbln or optimum-rbln is changed.

Each op is ``{"embed": [texts]}`` or ``{"score": [query, [documents]]}``; each result has the vectors or scores, the
FLOPs the stand-in's runtimes executed for it and the number of runtime calls (steps). The run also reports every
graph compiled: its input names, shapes, dtypes and the compile options.

As a script (``python tests/vllm_rbln_run.py REQUEST.json``) it is the subprocess itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
STANDIN = TESTS / "standin"
STUBS = STANDIN / "stubs"
VLLM_RBLN_PLUGINS = "rbln,rbln_custom_ops,rbln_new_models"  # vllm-rbln's entry points, and no others


def environment(cache_root: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("RBLN_RETRIEVAL_CACHE_DIR", "VLLM_CPU_OMP_THREADS_BIND"):
        env.pop(name, None)
    env.update(
        PYTHONPATH=os.pathsep.join([str(STANDIN), str(STUBS)]),
        VLLM_PLUGINS=VLLM_RBLN_PLUGINS,
        REBEL_STANDIN_NPU="RBLN-CA25",
        REBEL_STANDIN_RULES="sdk",
        VLLM_CACHE_ROOT=cache_root,  # vllm-rbln's compiled-model cache: a fresh one, so the run compiles
        VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine core in this process: the stand-in's counters are here
        HF_HUB_OFFLINE="1",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    return env


def run(
    model: Path,
    ops: list[dict[str, Any]],
    *,
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    timeout: float = 1800,
) -> dict[str, Any]:
    """vllm-rbln's engine for ``model`` started once (None: vllm-rbln's own defaults), ``ops`` run on it in order,
    every text truncated to the engine's length; raises with the engine's log on failure."""
    with tempfile.TemporaryDirectory(prefix="vllm-rbln-") as tmp:
        request = Path(tmp) / "request.json"
        answer = Path(tmp) / "answer.json"
        spec = {"model": str(model), "max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "ops": ops}
        request.write_text(json.dumps({**spec, "answer": str(answer)}))
        done = subprocess.run(
            [sys.executable, __file__, str(request)],
            env=environment(str(Path(tmp) / "vllm-cache")),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 or not answer.is_file():
            raise RuntimeError(f"vllm-rbln's engine failed ({done.returncode}):\n{done.stderr[-6000:]}")
        return json.loads(answer.read_text())


def _graph(compiled: Any) -> dict[str, Any]:
    options = {k: v for k, v in compiled.options.items() if k != "compile_context"}
    context = compiled.options.get("compile_context")
    return {
        "input_names": compiled.input_names,
        "input_shapes": [list(s) for s in compiled.input_shapes],
        "input_dtypes": compiled.input_dtypes,
        "options": {
            k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in options.items()
        },
        "compile_context": None if context is None else vars(context),
        "weights": compiled.weights,
        "flops": compiled.flops,
    }


def _main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    from rebel import aot, contract
    from vllm import LLM

    sizes = {k: request[k] for k in ("max_model_len", "max_num_seqs") if request[k] is not None}
    llm = LLM(model=request["model"], runner="pooling", dtype="float32", **sizes)
    config = llm.llm_engine.vllm_config
    length = config.model_config.max_model_len
    cut = {"truncation": True, "max_length": length}
    results = []
    for op in request["ops"]:
        first = len(contract.EXECUTED)
        if "embed" in op:
            out: Any = [o.outputs.embedding for o in llm.embed(op["embed"], use_tqdm=False, tokenization_kwargs=cut)]
        else:
            query, documents = op["score"]
            out = [o.outputs.score for o in llm.score(query, documents, use_tqdm=False, tokenization_kwargs=cut)]
        executed = contract.EXECUTED[first:]
        results.append({"result": out, "flops": sum(executed), "steps": len(executed)})
    graphs = [_graph(c) for c in contract.COMPILED]
    engine = {"max_model_len": length, "max_num_seqs": config.scheduler_config.max_num_seqs}
    answer = {"ops": results, "graphs": graphs, "runtimes": len(aot.RUNTIMES), "engine": engine}
    Path(request["answer"]).write_text(json.dumps(answer))


if __name__ == "__main__":
    _main(sys.argv[1])
