"""The seed's system and ours side by side, on the same stand-in compiler and the same inputs.

The seed of this project is vllm-rbln's pooling pull request; its successor, vllm-rbln 0.12, serves encoders through
optimum-rbln. Both run here on the test-only stand-in for rebel-compiler (tests/standin), as on an ATOM NPU
(RBLN-CA25): vllm-rbln 0.12's own engine, unmodified, with only its plugins loaded (tests/vllm_rbln_run.py, a
subprocess); rbln-retrieval's engine with ``device="rbln"`` and its default step shapes, in this process. For each
family both accept (vllm-rbln's architecture registry decides), on a mixed corpus (tests/corpus.py: 40 passages
from one word to thousands, truncated at the model's length; 16 short queries):

- min cosine against sentence-transformers (all-MiniLM-L6-v2, real weights) or plain transformers with the model's
  own pooling (tiny random-weight models), and against the same model CLS-pooled (the pooling vllm-rbln forces); for
  a cross-encoder the largest score difference;
- FLOPs executed per passage and per query, counted by the stand-in on every graph call its runtimes ran;
- graphs compiled; requests per step (requests / graph calls).

For every other family: which system supports it. FLOPs and graph counts do not depend on the machine; nothing here
is a speed or an NPU result.

    HF_HUB_OFFLINE=1 TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python bench/seed_side_by_side.py

Writes bench/results/seed_side_by_side.json and prints its Markdown (bench/seed_tables.py): the tables of
docs/rbln.md and the README's row, which tests/project/test_seed_tables.py holds to that file.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
os.environ.setdefault("VLLM_PLUGINS", "")

# The stand-in compiler, the corpus, the tiny models, their references and vllm-rbln's runner are the tests'.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "standin"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import numpy as np
import reference
from corpus import mixed_length
from model_builders import BUILDERS, minilm_path
from npu import rbln_options
from seed_tables import markdown
from vllm_rbln_run import run

RESULTS = Path(__file__).resolve().parent / "results"
NPU = "RBLN-CA25"


@dataclass(frozen=True)
class Family:
    name: str  # a tests/model_builders.py builder, or all-MiniLM-L6-v2
    task: str  # "embed" or "score"
    pooling: str = "MEAN"  # the model's own pooling (the reference's)


MEASURED = (
    Family("all-MiniLM-L6-v2", "embed"),
    Family("xlm-roberta-mean", "embed"),
    Family("xlm-roberta-cross-encoder", "score"),
)


def corpus() -> tuple[list[str], list[str]]:
    passages = mixed_length(40)
    queries = [" ".join(p.split()[:7]) + "?" for p in passages[:16]]
    return passages, queries


def model_path(name: str, root: Path) -> Path:
    if name == "all-MiniLM-L6-v2":
        return minilm_path()
    path = root / name
    if not (path / "config.json").exists():
        BUILDERS[name](path)
        config = json.loads((path / "config.json").read_text())
        if config.get("model_type") in ("roberta", "xlm-roberta"):
            # Real RoBERTa/XLM-R checkpoints carry it (transformers 5 no longer writes it), and vLLM 0.30's config
            # check for these architectures reads it.
            config.setdefault("position_embedding_type", "absolute")
            (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def vllm_rbln_accepts(path: Path) -> bool:
    """vllm-rbln 0.12's own registry of the architectures its optimum path serves for pooling."""
    from transformers import PretrainedConfig
    from vllm_rbln.utils.optimum.registry import is_pooling_arch

    config = json.loads((path / "config.json").read_text())
    return is_pooling_arch(PretrainedConfig(architectures=config.get("architectures")))


def min_cosine(got: np.ndarray, expected: np.ndarray) -> float:
    cos = np.sum(got * expected, 1) / np.linalg.norm(got, axis=1) / np.linalg.norm(expected, axis=1)
    return float(cos.min())


def expected_vectors(family: Family, path: Path, texts: list[str], max_length: int) -> np.ndarray:
    if family.name == "all-MiniLM-L6-v2":
        from sentence_transformers import SentenceTransformer

        return SentenceTransformer(str(path), device="cpu").encode(texts, normalize_embeddings=True)
    return reference.embed(str(path), texts, pooling=family.pool.pooling, max_length=max_length)


def pairs(queries: list[str], passages: list[str]) -> list[tuple[str, list[str]]]:
    """The cross-encoder workload: each of 4 queries against 10 passages (40 pairs)."""
    return [(q, passages[i * 10 : i * 10 + 10]) for i, q in enumerate(queries[:4])]


def summary(ops: list[dict[str, Any]], counts: list[int], graphs: int) -> dict[str, Any]:
    flops = [op["flops"] / n for op, n in zip(ops, counts)]
    steps = sum(op["steps"] for op in ops)
    return {"flops_per_item": flops, "graphs": graphs, "requests_per_step": sum(counts) / steps, "steps": steps}


def seed_side(family: Family, path: Path, passages: list[str], queries: list[str]) -> dict[str, Any]:
    if family.task == "embed":
        ops = [{"embed": passages}, {"embed": queries}]
    else:
        ops = [{"score": [q, docs]} for q, docs in pairs(queries, passages)]
    answer = run(path, ops)
    counts = [len(passages), len(queries)] if family.task == "embed" else [len(op["score"][1]) for op in ops]
    out = summary(answer["ops"], counts, len(answer["graphs"]))
    out["engine"], out["results"] = answer["engine"], [op["result"] for op in answer["ops"]]
    out["compiled"] = answer["graphs"]
    return out


def our_side(family: Family, path: Path, passages: list[str], queries: list[str]) -> dict[str, Any]:
    from rebel import aot, contract

    from rbln_retrieval import PoolingEngine
    from rbln_retrieval.backend.npu import rbln_runtime

    # The stand-in NPU counts as present (device nodes are hardware), as in tests/backend/conftest.py.
    rbln_runtime.probe = lambda: rbln_runtime.RuntimeProbe(True, 1, "the stand-in NPU")
    os.environ["RBLN_RETRIEVAL_CACHE_DIR"] = tempfile.mkdtemp(prefix="seed-side-by-side-")
    first = len(contract.COMPILED)
    engine = PoolingEngine(path, **rbln_options(NPU, default_shapes=True))
    try:
        compiled = contract.COMPILED[first:]
        results, ops, counts = [], [], []
        work = [("embed", passages), ("embed", queries)] if family.task == "embed" else pairs(queries, passages)
        for head, texts in work:
            start = len(contract.EXECUTED)
            if family.task == "embed":
                results.append(engine.embed(texts).tolist())
            else:
                results.append([float(s) for s in engine.score(head, texts)])
            executed = contract.EXECUTED[start:]
            ops.append({"flops": sum(executed), "steps": len(executed)})
            counts.append(len(texts))
        out = summary(ops, counts, len(compiled))
        out["results"] = results
        out["compiled"] = [
            {
                "input_names": g.input_names,
                "input_shapes": [list(s) for s in g.input_shapes],
                "input_dtypes": g.input_dtypes,
                "options": sorted(g.options),
            }
            for g in compiled
        ]
        out["runtimes"] = len(aot.RUNTIMES)
        return out
    finally:
        engine.close()


def accuracy(
    family: Family, path: Path, side: dict[str, Any], passages: list[str], queries: list[str], max_length: int
) -> dict[str, float]:
    if family.task == "embed":
        got = [np.array(r, dtype=np.float32) for r in side["results"]]
        expected = [expected_vectors(family, path, texts, max_length) for texts in (passages, queries)]
        # vllm-rbln forces CLS pooling: against the same model CLS-pooled, its gap is the pooling, not the arithmetic.
        cls = [reference.embed(str(path), texts, pooling="CLS", max_length=max_length) for texts in (passages, queries)]
        return {
            "min_cosine": min(min_cosine(g, e) for g, e in zip(got, expected)),
            "min_cosine_cls_pooling": min(min_cosine(g, e) for g, e in zip(got, cls)),
        }
    diffs = [
        np.abs(np.array(got) - reference.cross_encoder_scores(str(path), q, docs, max_length=max_length)).max()
        for got, (q, docs) in zip(side["results"], pairs(queries, passages))
    ]
    return {"max_score_difference": float(max(diffs))}


def measure(family: Family, root: Path) -> dict[str, Any]:
    path = model_path(family.name, root)
    passages, queries = corpus()
    seed = seed_side(family, path, passages, queries)
    ours = our_side(family, path, passages, queries)
    length = seed["engine"]["max_model_len"]
    for side in (seed, ours):
        side.update(accuracy(family, path, side, passages, queries, length))
        del side["results"]
    return {"family": family.name, "task": family.task, "vllm-rbln 0.12": seed, "rbln-retrieval": ours}


def support(root: Path) -> list[dict[str, Any]]:
    rows = []
    for name in ["all-MiniLM-L6-v2", *BUILDERS]:
        path = model_path(name, root)
        architectures = json.loads((path / "config.json").read_text()).get("architectures")
        rows.append(
            {
                "family": name,
                "architectures": architectures,
                "vllm-rbln 0.12": vllm_rbln_accepts(path),
                "rbln-retrieval": True,
            }
        )
    return rows


def main() -> None:
    """All families in one run (``make bench``); ``--family`` measures some into ``--out``, and ``--merge`` joins
    such partial runs (to spread one run over several processes)."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--family", action="append", choices=[f.name for f in MEASURED])
    parser.add_argument("--no-support", action="store_true", help="skip the table of which system supports what")
    parser.add_argument("--out", type=Path, default=RESULTS / "seed_side_by_side.json")
    parser.add_argument("--merge", type=Path, nargs="+", help="partial runs to join into --out")
    args = parser.parse_args()
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        measured = [row for f in MEASURED for part in parts for row in part["measured"] if row["family"] == f.name]
        supported = next((part["supported"] for part in parts if part["supported"]), None)
        supported = supported or support(Path(tempfile.mkdtemp(prefix="seed-models-")))
    else:
        root = Path(tempfile.mkdtemp(prefix="seed-models-"))
        measured = [measure(f, root) for f in MEASURED if not args.family or f.name in args.family]
        supported = [] if args.no_support else support(root)
    args.out.parent.mkdir(exist_ok=True)
    result = {"npu": NPU, "measured": measured, "supported": supported}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
