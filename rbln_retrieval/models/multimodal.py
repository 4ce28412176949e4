"""Image-text families: CLIP and SigLIP bi-encoders (one vector per image or text, in one space), and the
multimodal checkpoints rbln-retrieval recognises but refuses, each in one sentence.

vLLM 0.30 runs ``CLIPModel`` as CLIPEmbeddingModel and ``SiglipModel`` as SiglipEmbeddingModel: an image is a prompt
with no text and one image; a text is a token prompt whose last position is pooled (CLIP: the end-of-text token of an
unpadded prompt; SigLIP: the last position of a prompt padded to the text tower's length, as SigLIP was trained and as
transformers' ``get_text_features`` pools it; vLLM finds it by the drop in positions between prompts). The preset
reads both towers' configs.

Imports: errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError

# architecture -> family name
IMAGE_TEXT_ARCHS = {"CLIPModel": "clip", "SiglipModel": "siglip"}
# Multimodal retrievers and their reasons not to run here; each is refused by name rather than as "unsupported".
_REFUSED = {
    "ColPaliForRetrieval": (
        "vLLM 0.30's ColPali builds its projection without the checkpoint's bias and attends causally where "
        "transformers' ColPali attends bidirectionally over the image and prompt, so its page vectors differ from the "
        "model's"
    ),
    "ColQwen2ForRetrieval": "ColQwen's Qwen2-VL processor needs torchvision, which this platform cannot install",
    "ColQwen2_5": "ColQwen's Qwen2.5-VL processor needs torchvision, which this platform cannot install",
    "ColQwen3": "ColQwen's Qwen3-VL processor needs torchvision, which this platform cannot install",
    "CLIPTextModel": "a CLIP text tower alone embeds no images; use the full CLIPModel checkpoint",
    "CLIPVisionModel": "a CLIP vision tower alone embeds no texts; use the full CLIPModel checkpoint",
    "SiglipVisionModel": "a SigLIP vision tower alone embeds no texts; use the full SiglipModel checkpoint",
    "Siglip2Model": "vLLM 0.30 registers no SigLIP 2 embedding model",
}


def is_image_text(arch: str) -> bool:
    return arch in IMAGE_TEXT_ARCHS


def refusal(model_dir: Path, arch: str) -> ModelNotSupportedError | None:
    """One sentence refusing a multimodal checkpoint rbln-retrieval recognises but does not run, or None."""
    reason = _REFUSED.get(arch)
    if reason is None:
        return None
    return ModelNotSupportedError(f"{model_dir} is a {arch} checkpoint, which rbln-retrieval does not run: {reason}.")


def image_text_preset(model_dir: Path, config: dict[str, Any], arch: str) -> dict[str, Any]:
    """The ModelFamily fields of a CLIP or SigLIP checkpoint, or ModelNotSupportedError naming what is wrong."""
    name = IMAGE_TEXT_ARCHS[arch]
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    text_width = int(text.get("hidden_size") or 0)
    image_size = int(vision.get("image_size") or 0)
    max_length = int(text.get("max_position_embeddings") or 0)
    if not (text_width and image_size and max_length):
        raise ModelNotSupportedError(
            f"{model_dir} is a {arch} checkpoint whose config.json lacks text_config.hidden_size, "
            "text_config.max_position_embeddings or vision_config.image_size."
        )
    if name == "clip":
        width = int(config.get("projection_dim") or 0)
        if text_width > width:
            # vLLM carries CLIP's token embeddings in rows projection_dim wide.
            raise ModelNotSupportedError(
                f"{model_dir}'s text tower is {text_width} wide, over its projection_dim {width}, which vLLM 0.30's "
                "CLIP cannot run."
            )
    else:
        width = int(vision.get("hidden_size") or 0)
        text_out = int(text.get("projection_size") or text_width)
        if text_out != width:
            raise ModelNotSupportedError(
                f"{model_dir}'s SigLIP towers give vectors of different widths (text {text_out}, image {width})."
            )
    return {
        "name": name,
        "architecture": arch,
        "hidden_size": width,
        "max_length": max_length,
        # vLLM's CLIP pools the last position; its SigLIP reverses each text so that its last position comes first.
        "pooling": "LAST" if name == "clip" else "CLS",
        "normalize": True,
        "image_size": image_size,
        "pad_text_to_max_length": name == "siglip",
        "kv_bytes_per_token": _kv_bytes_per_token(text),
    }


def check_max_length(model_dir: Path, family_max: int, user_max_length: int | None) -> int:
    """SigLIP pools the last position of a text padded to the tower's length: a shorter max_length changes it."""
    if user_max_length is None or user_max_length == family_max:
        return family_max
    raise ValueError(
        f"max_length={user_max_length} does not apply to {model_dir}: an image-text model's texts take its text "
        f"tower's length ({family_max})."
    )


def _kv_bytes_per_token(text: dict[str, Any]) -> int:
    # CLIP's text tower attends causally through vLLM's KV cache (SigLIP's is encoder-only and keeps none).
    return int(2 * int(text.get("num_hidden_layers") or 1) * int(text.get("hidden_size") or 0) * 4)
