"""Print the parity figures the tests assert (fp32), per family, and the engine start time: for closing notes and
the README. Run with the project venv: .venv/bin/python bench/parity.py [--runner stock|bundled]"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import reference
from corpus import mixed_length
from model_builders import BUILDERS, minilm_path, remote_code_options

from rbln_retrieval import PoolingEngine
from rbln_retrieval.models.specs.qwen3_embedding import QWEN3_DEFAULT_TASK

QUERY = "How are exceptions raised and handled in Python?"


def bge_m3_differences(engine: PoolingEngine, path: str, texts: list[str]) -> dict[str, float]:
    """Max abs differences of bge-m3's dense, sparse (a token missing on one side weighs 0) and multi-vector
    outputs from FlagEmbedding's recipe."""
    dense, sparse, multi = reference.bge_m3(path, texts, max_length=512)
    got = engine.embed(texts, output=["dense", "sparse", "multi_vector"])
    return {
        "dense": float(np.abs(got["dense"] - dense).max()),
        "sparse": max(abs(a.get(t, 0.0) - b.get(t, 0.0)) for a, b in zip(got["sparse"], sparse) for t in {*a, *b}),
        "multi_vector": max(float(np.abs(a - b).max()) for a, b in zip(got["multi_vector"], multi)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runner", default="bundled")
    runner = parser.parse_args().runner
    texts = mixed_length(40)
    start = time.perf_counter()
    with PoolingEngine(minilm_path(), device="cpu", dtype="float32", runner=runner) as engine:
        started = time.perf_counter() - start
        from sentence_transformers import SentenceTransformer

        many = mixed_length(240)
        ours = engine.embed(many)
        ref = SentenceTransformer(str(minilm_path()), device="cpu").encode(many, normalize_embeddings=True)
        print(f"engine start (all-MiniLM-L6-v2, {runner}): {started:.1f} s")
        print(f"all-MiniLM-L6-v2 vs sentence-transformers, 240 texts: min cosine {(ours * ref).sum(1).min():.7f}")
    with tempfile.TemporaryDirectory() as root:
        for name, build in BUILDERS.items():
            path = str(build(Path(root) / name))
            options = remote_code_options(path)  # GTE-new and Nomic ship their config class as code
            with PoolingEngine(path, device="cpu", dtype="float32", runner=runner, **options) as engine:
                if name == "qwen3-reranker":
                    got = engine.score(QUERY, texts)
                    want = reference.qwen3_reranker_scores(
                        path, QUERY, texts, instruction=QWEN3_DEFAULT_TASK, max_length=512
                    )
                elif engine.family.name == "bge-m3":
                    for output, diff in bge_m3_differences(engine, path, texts).items():
                        print(f"{name + ' ' + output:28s} max abs diff vs FlagEmbedding recipe: {diff:.2e}")
                    continue
                elif engine.family.is_cross_encoder:
                    got, want = (
                        engine.score(QUERY, texts),
                        reference.cross_encoder_scores(path, QUERY, texts, max_length=512),
                    )
                else:
                    got = engine.embed(texts)
                    family = engine.family
                    want = reference.embed(
                        path, texts, pooling=family.pool.pooling, max_length=512, prefix=family.prompt.document_prompt
                    )
                print(f"{name:28s} max abs diff vs transformers reference: {np.abs(np.asarray(got) - want).max():.2e}")


if __name__ == "__main__":
    main()
