"""LlamaIndex RAG on rbln-retrieval: documents -> VectorStoreIndex with RBLNEmbedding -> query engine with the
RBLNReranker postprocessor and MockLLM (no LLM is called), printing the source nodes with their scores.

    python examples/llamaindex_rag.py ["question"] [--model DIR] [--reranker DIR] [--device auto|rbln|cpu]

--model and --reranker default to all-MiniLM-L6-v2, as in langchain_rag.py.
"""

from __future__ import annotations

if __name__ == "__main__":
    from rbln_retrieval.quiet import quiet_startup

    quiet_startup()
    from docs_corpus import rag_pages
    from example_args import rag_arguments
    from llama_index.core import Document, Settings, VectorStoreIndex
    from llama_index.core.llms import MockLLM
    from llama_index.core.node_parser import SentenceSplitter
    from transformers import AutoTokenizer

    from llama_index.embeddings.rbln import RBLNEmbedding
    from llama_index.postprocessor.rbln_rerank import RBLNReranker

    args = rag_arguments(__doc__.splitlines()[0])
    documents = [
        Document(text=page["text"], metadata={"page": page["id"], "title": page["title"]}) for page in rag_pages()
    ]
    Settings.embed_model = RBLNEmbedding(model_name=args.model, device=args.device)
    Settings.llm = MockLLM(max_tokens=32)  # stands in for a real LLM: retrieval is what this example shows
    # Chunks are measured in the embedding model's own tokens so they fit its limit (256 for all-MiniLM-L6-v2);
    # verbose=False: counting a whole page's tokens is not running it through the model.
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    splitter = SentenceSplitter(
        chunk_size=200,
        chunk_overlap=20,
        tokenizer=lambda text: tokenizer.encode(text, add_special_tokens=False, verbose=False),
    )
    index = VectorStoreIndex.from_documents(documents, transformations=[splitter], show_progress=True)

    reranker = RBLNReranker(model=args.reranker, device=args.device, top_n=3)
    query_engine = index.as_query_engine(similarity_top_k=8, node_postprocessors=[reranker])
    response = query_engine.query(args.question)

    print(
        f"{len(documents)} documents -> {len(index.docstore.docs)} nodes; retrieved 8, reranked to "
        f"{len(response.source_nodes)}"
    )
    for n, source in enumerate(response.source_nodes, 1):
        text = " ".join(source.node.get_content().split())
        print(f"{n}. {source.score:.3f}  [{source.node.metadata['page']}] {text[:90]}")
    print(f"\nMockLLM response ({len(str(response).split())} placeholder words; a real LLM would answer here)")
