"""The LangChain and LlamaIndex classes against an `rbln-retrieval serve` server instead of a local engine.

    rbln-retrieval serve /models/all-MiniLM-L6-v2 --port 8000          # on the machine with the NPU
    python examples/remote_client.py --base-url http://127.0.0.1:8000 --model /models/all-MiniLM-L6-v2

--model is the model's name on the server: the directory the server was started with. Only `base_url` (and
`api_key`, read from RBLN_API_KEY when not given) differ from local use; nothing starts vLLM in this process.
"""

from __future__ import annotations

import argparse

DOCUMENTS = [
    "The 'finally' clause of a try statement runs whether or not an exception occurred.",
    "A 'for' loop's 'else' clause runs when the loop was not ended by 'break'.",
    "The 'with' statement calls __enter__ before its block and __exit__ after it.",
]
QUERY = "How do I run cleanup code whether or not an exception occurs?"

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="URL of the server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the model's name on the server (the directory it serves)")
    parser.add_argument("--api-key", help="the server's key (default: $RBLN_API_KEY)")
    args = parser.parse_args()
    remote = {"base_url": args.base_url, **({"api_key": args.api_key} if args.api_key else {})}

    from langchain_rbln import RBLNEmbeddings, RBLNReranker
    from llama_index.embeddings.rbln import RBLNEmbedding
    from llama_index.postprocessor.rbln_rerank import RBLNReranker as LlamaIndexReranker

    embeddings = RBLNEmbeddings(model=args.model, **remote)
    vectors = embeddings.embed_documents(DOCUMENTS)
    print(f"LangChain RBLNEmbeddings: {len(vectors)} vectors of {len(vectors[0])} dims")
    for result in RBLNReranker(model=args.model, **remote).rerank(DOCUMENTS, QUERY):
        print(f"  {result['relevance_score']:.3f}  {DOCUMENTS[result['index']]}")

    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

    embedding = RBLNEmbedding(model_name=args.model, **remote)
    print(f"LlamaIndex RBLNEmbedding: query vector of {len(embedding.get_query_embedding(QUERY))} dims")
    nodes = [NodeWithScore(node=TextNode(text=text)) for text in DOCUMENTS]
    reranked = LlamaIndexReranker(model=args.model, top_n=2, **remote).postprocess_nodes(nodes, QueryBundle(QUERY))
    for node in reranked:
        print(f"  {node.score:.3f}  {node.node.get_content()}")
