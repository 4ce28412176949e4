"""Qwen3-Reranker's own example through rbln-retrieval: P(yes) that a document meets the query and instruction.

    python examples/qwen3_reranker.py Qwen/Qwen3-Reranker-0.6B [--device auto|rbln|cpu] [--dtype auto|float32|bfloat16]

The model card formats the chat prompt and reads the "yes"/"no" logits by hand; here `score` and `rerank` do it
(the original checkpoint runs as a one-row classifier, so no 151k-token LM head is computed per pair).
"""

from __future__ import annotations

from qwen3_embedding import DOCUMENTS, QUERIES, TASK  # the model cards use the same pairs

if __name__ == "__main__":
    from rbln_retrieval.quiet import quiet_startup

    quiet_startup()
    from example_args import qwen3_arguments

    from rbln_retrieval import PoolingEngine

    args = qwen3_arguments(__doc__.splitlines()[0], "qwen3-reranker", "Qwen/Qwen3-Reranker-0.6B")
    with PoolingEngine(args.model, device=args.device, dtype=args.dtype) as engine:
        print("P(yes) for (query, document):")
        for query in QUERIES:
            scores = engine.score(query, DOCUMENTS, instruction=TASK)
            print(f"  {query:<32} " + "  ".join(f"{score:.4f}" for score in scores))
        query = QUERIES[1]
        print(f"rerank for {query!r}:")
        for index, score in engine.rerank(query, DOCUMENTS, instruction=TASK):
            print(f"  {score:.4f}  {DOCUMENTS[index][:70]}")
