from llama_index.embeddings.rbln.base import RBLNEmbedding

__all__ = ["RBLNEmbedding"]
