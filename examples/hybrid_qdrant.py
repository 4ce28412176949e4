"""Hybrid retrieval with bge-m3: dense and sparse vectors from one engine, fused by Qdrant (local mode).

    python examples/hybrid_qdrant.py BAAI/bge-m3 ["question"] [--pages N] [--device auto|rbln|cpu] [--dtype ...]

Indexes the Python documentation's passages into a QdrantVectorStore kept in memory (Qdrant's local mode, no
server) with `RBLNEmbeddings` (dense) and `RBLNSparseEmbeddings` (bge-m3's lexical weights), then answers the
question three ways: dense only, sparse only, and hybrid (reciprocal rank fusion of both). Needs the qdrant extra:
`pip install "langchain-rbln[qdrant]"`.
"""

from __future__ import annotations

from rbln_retrieval.cli import quiet_startup

quiet_startup()

QUESTION = "How do I run cleanup code whether or not an exception occurs?"


def main() -> None:
    import argparse

    from docs_corpus import load_documents, split
    from langchain_core.documents import Document
    from langchain_qdrant import QdrantVectorStore, RetrievalMode

    from langchain_rbln import RBLNEmbeddings, RBLNSparseEmbeddings
    from rbln_retrieval import ModelNotSupportedError, detect_family, resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="Hugging Face id or directory of a bge-m3 checkpoint (BAAI/bge-m3)")
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--pages", type=int, default=None, help="index only the first N documentation pages")
    parser.add_argument("--device", choices=("auto", "rbln", "cpu"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    args = parser.parse_args()
    try:
        family = detect_family(resolve_model(args.model).path).name
    except ModelNotSupportedError as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    if family != "bge-m3":
        parser.exit(2, f"{parser.prog}: {args.model} is a {family} model without bge-m3's sparse head.\n")

    passages = [p for document in load_documents()[: args.pages] for p in split(document)]
    documents = [Document(page_content=p.text, metadata={"page": p.doc_id}) for p in passages]
    options = {"model": args.model, "device": args.device, "dtype": args.dtype}
    # The two objects share one engine: each passage costs one dense and one sparse forward on it.
    with RBLNEmbeddings(**options) as dense, RBLNSparseEmbeddings(**options) as sparse:
        store = QdrantVectorStore.from_documents(
            documents,
            dense,
            sparse_embedding=sparse,
            location=":memory:",
            collection_name="python-docs",
            retrieval_mode=RetrievalMode.HYBRID,
        )
        print(f"{len(documents)} passages indexed (dense {dense.engine.dimension} dims + sparse)")
        print(f"question: {args.question}")
        for mode in (RetrievalMode.DENSE, RetrievalMode.SPARSE, RetrievalMode.HYBRID):
            store.retrieval_mode = mode
            print(f"{mode.value}:")
            for rank, (doc, score) in enumerate(store.similarity_search_with_score(args.question, k=3), 1):
                first_line = doc.page_content.splitlines()[0]
                print(f"{rank}. {score:.4f}  [{doc.metadata['page']}] {first_line}")
        store.client.close()


if __name__ == "__main__":  # vLLM's engine process imports this module again
    main()
