from llama_index.embeddings.rbln.base import RBLNEmbedding
from llama_index.embeddings.rbln.multimodal import RBLNMultiModalEmbedding
from llama_index.embeddings.rbln.sparse import RBLNSparseEmbedding

__all__ = ["RBLNEmbedding", "RBLNMultiModalEmbedding", "RBLNSparseEmbedding"]
