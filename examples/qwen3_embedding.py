"""Qwen3-Embedding's own example through rbln-retrieval: queries carry an instruction, documents do not.

    python examples/qwen3_embedding.py Qwen/Qwen3-Embedding-0.6B [--device auto|rbln|cpu]
        [--dtype auto|float32|bfloat16]

The model card builds "Instruct: {task}\\nQuery:{query}" by hand; here `kind="query"` applies that template with
`instruction` as the task, and documents are embedded as they are.
"""

from __future__ import annotations

TASK = "Given a web search query, retrieve relevant passages that answer the query"
QUERIES = ["What is the capital of China?", "Explain gravity"]
DOCUMENTS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other. It gives weight to physical objects and is "
    "responsible for the movement of planets around the sun.",
]
# Printed by the model card's example for Qwen3-Embedding-0.6B.
MODEL_CARD_0_6B = [[0.7646, 0.1414], [0.1355, 0.6000]]

if __name__ == "__main__":
    from rbln_retrieval.quiet import quiet_startup

    quiet_startup()
    from example_args import qwen3_arguments

    from rbln_retrieval import PoolingEngine
    from rbln_retrieval.text.prompts import embed_prefix

    args = qwen3_arguments(__doc__.splitlines()[0], "qwen3-embedding", "Qwen/Qwen3-Embedding-0.6B")
    with PoolingEngine(args.model, device=args.device, dtype=args.dtype) as engine:
        queries = engine.embed(QUERIES, kind="query", instruction=TASK)
        documents = engine.embed(DOCUMENTS)
        print(f"query prompt: {embed_prefix(engine.family, engine.model, 'query', TASK)!r}")
        print(f"vectors: {engine.dimension} dims, unit length")
        print("cosine(query, document):")
        for query, row in zip(QUERIES, queries @ documents.T):
            print(f"  {query:<32} " + "  ".join(f"{score:.4f}" for score in row))
        print(f"  (the model card prints {MODEL_CARD_0_6B} for Qwen3-Embedding-0.6B)")
        # Matryoshka: the first 256 dimensions, renormalized, rank the same way at a third of the storage.
        if engine.dimension > 256:
            small = engine.embed(QUERIES, kind="query", instruction=TASK, dimensions=256)
            small_docs = engine.embed(DOCUMENTS, dimensions=256)
            print("cosine with dimensions=256:")
            for query, row in zip(QUERIES, small @ small_docs.T):
                print(f"  {query:<32} " + "  ".join(f"{score:.4f}" for score in row))
