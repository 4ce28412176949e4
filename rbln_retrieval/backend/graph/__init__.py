"""The compiled graph and what runs in it: torch.compile with the target's backend (``compile``), pooling re-expressed
on static shapes (``pooling``), the host kernels' C RMSNorm and in-place encoder blocks (``host_kernels``,
``host_layers``), the architectures vLLM runs fixed: SPLADE's loader (``splade``), ColPali's projection bias
and attention (``colpali``), and CLIP's and SigLIP's vision and text towers on traced targets (``dual_encoder``).

Stages it may import: npu, vllm_compat
"""

# The architectures the graph adds to vLLM, by name and "module:class": rbln_retrieval.backend.register_models
# registers them in every vLLM process, and vLLM imports a module only when it builds (or inspects) its model. The
# family specs name them in their hf_overrides (FamilySpec.bundled_model).
ARCHITECTURES = {
    "RblnBertSpladeModel": f"{__name__}.splade:RblnBertSpladeModel",
    "RblnColPaliModel": f"{__name__}.colpali:RblnColPaliModel",
}
