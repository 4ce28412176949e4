"""The architectures the bundled backend runs fixed, one module each, as vLLM's model files are: the only backend
modules that name a model family, since each is that family's graph. ``splade`` fixes the SPLADE loader and pooler,
``colpali`` ColPali's projection bias, attention and vision entry, and ``dual_encoder`` the image-text models'
(CLIP, SigLIP) text tower and every traced vision tower. The runner reaches them by capability (a model's
``traced_vision_tower`` hook, ``vllm_compat.dual_encoder_text``), never by name.
"""

# By name and "module:class": rbln_retrieval.backend.register_general registers them in every vLLM process, and vLLM
# imports a module only when it builds (or inspects) its model. The family specs name them in their hf_overrides
# (FamilySpec.bundled_model).
ARCHITECTURES = {
    "RblnBertSpladeModel": f"{__name__}.splade:RblnBertSpladeModel",
    "RblnColPaliModel": f"{__name__}.colpali:RblnColPaliModel",
}
