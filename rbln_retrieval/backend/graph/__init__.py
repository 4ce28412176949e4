"""The compiled graph and what runs in it: torch.compile with the target's backend (``compile``), pooling re-expressed
on static shapes (``pooling``), the host kernels' C RMSNorm and in-place encoder blocks (``host_kernels``,
``host_layers``), and the architectures vLLM runs fixed: SPLADE's loader (``splade``), ColPali's projection bias
and attention (``colpali``).

Stages it may import: npu, vllm_compat
"""
