"""The compiled graph and what runs in it: torch.compile with the target's backend (``compile``), pooling re-expressed
on static shapes (``pooling``), the host kernels' C RMSNorm and in-place encoder blocks (``host_kernels``,
``host_layers``), and the SPLADE architecture with its loader fixed (``splade``).

Stages it may import: npu, vllm_compat
"""
