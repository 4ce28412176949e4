"""Image-text families: CLIP and SigLIP bi-encoders (one vector per image or text, in one space), and the
multimodal checkpoints rbln-retrieval recognises but refuses, each in one sentence.

vLLM 0.30 runs ``CLIPModel`` as CLIPEmbeddingModel and ``SiglipModel`` as SiglipEmbeddingModel: an image is a prompt
with no text and one image; a text is a token prompt whose last position is pooled (CLIP: the end-of-text token of an
unpadded prompt; SigLIP: the last position of a prompt padded to the text tower's length, as SigLIP was trained and as
transformers' ``get_text_features`` pools it; vLLM finds it by the drop in positions between prompts). Each family's
preset (models/specs/clip.py, siglip.py) reads both towers' configs through ``tower_fields``.

Imports: errors, models (spec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.spec import Checkpoint

# Multimodal retrievers and their reasons not to run here; each is refused by name rather than as "unsupported".
_REFUSED = {
    "ColQwen2ForRetrieval": "ColQwen's Qwen2-VL processor needs torchvision, which this platform cannot install",
    "ColQwen2_5": "ColQwen's Qwen2.5-VL processor needs torchvision, which this platform cannot install",
    "ColQwen3": "ColQwen's Qwen3-VL processor needs torchvision, which this platform cannot install",
    "CLIPTextModel": "a CLIP text tower alone embeds no images; use the full CLIPModel checkpoint",
    "CLIPVisionModel": "a CLIP vision tower alone embeds no texts; use the full CLIPModel checkpoint",
    "SiglipVisionModel": "a SigLIP vision tower alone embeds no texts; use the full SiglipModel checkpoint",
    "Siglip2Model": "vLLM 0.30 registers no SigLIP 2 embedding model",
}


def texts_only(model: str, family: str) -> str:
    """The sentence refusing images to a ``family`` model that embeds texts only (local, remote and the server)."""
    return f"{model} is a {family} model, which embeds texts only; images need CLIP, SigLIP or ColPali."


def refusal(model_dir: Path, arch: str) -> ModelNotSupportedError | None:
    """One sentence refusing a multimodal checkpoint rbln-retrieval recognises but does not run, or None."""
    reason = _REFUSED.get(arch)
    if reason is None:
        return None
    return ModelNotSupportedError(f"{model_dir} is a {arch} checkpoint, which rbln-retrieval does not run: {reason}.")


def tower_fields(ckpt: Checkpoint) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(text_config, vision_config, the ModelFamily fields both image-text families read alike), or
    ModelNotSupportedError naming what the config lacks."""
    text = ckpt.config.get("text_config") or {}
    vision = ckpt.config.get("vision_config") or {}
    image_size = int(vision.get("image_size") or 0)
    max_length = int(text.get("max_position_embeddings") or 0)
    if not (text.get("hidden_size") and image_size and max_length):
        raise ModelNotSupportedError(
            f"{ckpt.path} is a {ckpt.arch} checkpoint whose config.json lacks text_config.hidden_size, "
            "text_config.max_position_embeddings or vision_config.image_size."
        )
    fields = {
        "architecture": ckpt.arch,
        "max_length": _check_max_length(ckpt.path, max_length, ckpt.user_max_length),
        "normalize": True,
        "image_size": image_size,
        "kv_bytes_per_token": _kv_bytes_per_token(text),
    }
    return text, vision, fields


def _check_max_length(model_dir: Path, family_max: int, user_max_length: int | None) -> int:
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
