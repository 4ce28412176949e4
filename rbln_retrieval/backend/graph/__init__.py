"""The compiled graph and what runs in it: torch.compile with the target's backend (``compile``), pooling re-expressed
on static shapes (``pooling``), the host kernels' C RMSNorm and in-place encoder blocks (``host_kernels``,
``host_layers``), and the architectures vLLM runs fixed, one module each (``architectures``: a loader, a projection
bias and attention, image-text towers on traced targets).

Stages it may import: npu, vllm_compat
"""

from rbln_retrieval.backend.graph.architectures import ARCHITECTURES

__all__ = ["ARCHITECTURES"]
