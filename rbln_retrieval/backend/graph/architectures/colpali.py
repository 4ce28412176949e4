"""ColPali on vLLM: vLLM 0.30's ColPaliModel with two fixes, registered under its own name, so its token vectors
are transformers' ColPaliForRetrieval's.

- Projection: vLLM builds ``custom_text_proj`` without a bias whenever the config names the embedding size, and
  then drops the checkpoint's ``embedding_proj_layer.bias`` (transformers' and colpali-engine's projection is an
  ``nn.Linear`` with one). Here it always has one, loaded from the checkpoint (zero where a checkpoint has none).
- Attention: vLLM runs model type ``colpali`` through Gemma's causal attention. transformers' ColPali passes its
  processor's ``token_type_ids`` (all zero: every page and query token is prefix) to PaliGemma, which then attends
  bidirectionally over the whole prompt. Here every Gemma layer's attention is encoder-only (no causal mask, no KV
  cache), which is that attention.
- Loading: checkpoints saved by transformers 5 name the vision tower's weights without ``vision_model.``.
- Traced targets: ``traced_vision_tower`` (the runner's hook) names the image tokens' embeddings (SigLIP's tower,
  then PaliGemma's projector: vLLM's ``embed_multimodal`` for pixels) for the runner's static vision graphs; vLLM's
  runner merges them into the step's input embeddings on the host, and the Gemma runs in the step graphs as any
  text model does.
- Processing: the image tokens and <bos> go first whatever the tokenizer's add_bos_token says, as ColPaliProcessor
  puts them; PaliGemma's vision tower is SigLIP's, named directly (vLLM's lookup imports torchvision).

Imports: vllm, torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from vllm.model_executor.layers.attention.encoder_only_attention import EncoderOnlyAttention
from vllm.model_executor.models.colpali import ColPaliModel, ColPaliMultiModalProcessor, ColPaliProcessingInfo
from vllm.model_executor.models.paligemma import PaliGemmaDummyInputsBuilder
from vllm.model_executor.models.siglip import SiglipEncoderInfo
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.processing import PromptIndexTargets, PromptUpdate


class RblnColPaliProcessingInfo(ColPaliProcessingInfo):
    def get_vision_encoder_info(self) -> SiglipEncoderInfo:
        # PaliGemma's vision tower is SigLIP's; vLLM's lookup of it imports Pixtral's image processor first, which
        # needs torchvision.
        return SiglipEncoderInfo(self.get_hf_config())


class RblnColPaliMultiModalProcessor(ColPaliMultiModalProcessor):
    def _get_prompt_updates(self, *args: Any, **kwargs: Any) -> Sequence[PromptUpdate]:
        # ColPaliProcessor puts the image tokens and <bos> first, before the page prompt; vLLM's PaliGemma puts them
        # after a leading <bos> when the tokenizer's add_bos_token is set, which would add a token.
        updates = super()._get_prompt_updates(*args, **kwargs)
        return [dataclasses.replace(update, target=PromptIndexTargets.start()) for update in updates]


@MULTIMODAL_REGISTRY.register_processor(
    RblnColPaliMultiModalProcessor, info=RblnColPaliProcessingInfo, dummy_inputs=PaliGemmaDummyInputsBuilder
)
class RblnColPaliModel(ColPaliModel):
    def __init__(self, *, vllm_config, prefix: str = ""):  # type: ignore[no-untyped-def]
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        _bidirectional(self.language_model.model.layers, vllm_config)
        hidden, dim = self._proj_hidden_size, self.embed_dim
        if dim is not None:
            self.custom_text_proj = nn.Linear(hidden, dim, bias=True, dtype=vllm_config.model_config.head_dtype)
            nn.init.zeros_(self.custom_text_proj.bias)
            self.pooler.head.projector = self.custom_text_proj

    def image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[n, 3, size, size]`` pixels -> ``[n, image tokens, hidden]``: the embeddings vLLM merges at the image
        tokens' positions."""
        return self.multi_modal_projector(self.vision_tower(pixel_values))

    def traced_vision_tower(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], int]:
        """The runner's hook on traced targets: the vision entry its graphs run (pixels -> image-token embeddings)
        and the fixed image size."""
        return self.image_features, int(self.config.vision_config.image_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded: set[str] = super().load_weights((_vision_name(name), tensor) for name, tensor in weights)
        # A checkpoint without the bias keeps the zero it was built with.
        return loaded | {"custom_text_proj.bias", "pooler.head.projector.bias"}


def _vision_name(name: str) -> str:
    """transformers 5 saves PaliGemma's SigLIP tower without its ``vision_model.`` level; vLLM's tower has it."""
    tower = "vlm.vision_tower."
    if name.startswith(tower) and not name.startswith(tower + "vision_model."):
        return tower + "vision_model." + name[len(tower) :]
    return name


def _bidirectional(layers: Iterable[nn.Module], vllm_config) -> None:  # type: ignore[no-untyped-def]
    """Each layer's causal attention replaced by encoder-only attention of the same shape and name."""
    forward_context = vllm_config.compilation_config.static_forward_context
    for layer in layers:
        causal = layer.self_attn.attn
        del forward_context[causal.layer_name]  # the name is registered once, by the layer that serves it
        layer.self_attn.attn = EncoderOnlyAttention(
            causal.num_heads,
            causal.head_size,
            layer.self_attn.scaling,
            num_kv_heads=causal.num_kv_heads,
            cache_config=vllm_config.cache_config,
            prefix=causal.layer_name,
        )
