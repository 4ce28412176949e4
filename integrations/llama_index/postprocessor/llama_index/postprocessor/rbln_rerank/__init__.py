from llama_index.postprocessor.rbln_rerank.base import RBLNReranker

__all__ = ["RBLNReranker"]
