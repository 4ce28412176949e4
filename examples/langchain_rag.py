"""LangChain RAG on rbln-retrieval: text splitter -> RBLNEmbeddings -> Chroma -> retriever -> RBLNReranker -> a
prompt for an LLM (printed; no LLM is called).

    python examples/langchain_rag.py ["question"] [--model DIR] [--reranker DIR] [--device auto|rbln|cpu]

Defaults to all-MiniLM-L6-v2 for both steps (a bi-encoder reranks by cosine similarity); pass a cross-encoder or
Qwen3-Reranker directory as --reranker for a real reranker.
"""

from __future__ import annotations

if __name__ == "__main__":
    from rbln_retrieval.quiet import quiet_startup

    quiet_startup()
    import chromadb
    from docs_corpus import rag_pages
    from example_args import rag_arguments
    from langchain_chroma import Chroma
    from langchain_classic.retrievers import ContextualCompressionRetriever
    from langchain_core.documents import Document
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    from langchain_rbln import RBLNEmbeddings, RBLNReranker

    args = rag_arguments(__doc__.splitlines()[0])
    pages = [Document(page["text"], metadata={"page": page["id"], "title": page["title"]}) for page in rag_pages()]
    # ~800 characters stay under all-MiniLM-L6-v2's 256-token limit.
    chunks = RecursiveCharacterTextSplitter(chunk_size=800, chunk_overlap=80).split_documents(pages)

    embeddings = RBLNEmbeddings(model=args.model, device=args.device, show_progress=True)
    store = Chroma.from_documents(
        chunks,
        embeddings,
        collection_name="python-docs",
        collection_metadata={"hnsw:space": "cosine"},
        client_settings=chromadb.Settings(anonymized_telemetry=False),
    )
    retriever = ContextualCompressionRetriever(
        base_compressor=RBLNReranker(model=args.reranker, device=args.device, top_n=3),
        base_retriever=store.as_retriever(search_kwargs={"k": 8}),
    )
    best = retriever.invoke(args.question)

    print(f"{len(pages)} pages -> {len(chunks)} chunks in Chroma; retrieved 8, reranked to {len(best)}")
    for n, doc in enumerate(best, 1):
        text = " ".join(doc.page_content.split())
        print(f"{n}. {doc.metadata['relevance_score']:.3f}  [{doc.metadata['page']}] {text[:90]}")
    prompt = ChatPromptTemplate.from_messages(
        [
            (
                "system",
                "Answer the question using only the context below. Say so if the context does not answer it.\n\n"
                "Context:\n{context}",
            ),
            ("human", "{question}"),
        ]
    )
    context = "\n\n".join(f"[{doc.metadata['title']}]\n{doc.page_content}" for doc in best)
    print("\nPrompt for an LLM:\n")
    print(prompt.invoke({"context": context, "question": args.question}).to_string())
