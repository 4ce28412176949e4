"""CLIP (``CLIPModel``): images and texts into one space; vLLM's CLIP pools a text's last position (the end-of-text
token of an unpadded prompt) and carries token embeddings in rows projection_dim wide.

Imports: errors, models (multimodal, spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.spec import Checkpoint, FamilySpec
from rbln_retrieval.models.specs.image_text import tower_fields

ARCH = "CLIPModel"


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    text, _, fields = tower_fields(ckpt)
    text_width = int(text["hidden_size"])
    width = int(ckpt.config.get("projection_dim") or 0)
    if text_width > width:
        raise ModelNotSupportedError(
            f"{ckpt.path}'s text tower is {text_width} wide, over its projection_dim {width}, which vLLM 0.30's "
            "CLIP cannot run."
        )
    return {**fields, "hidden_size": width, "pooling": "LAST"}


SPEC = FamilySpec(
    name="clip",
    architectures=frozenset({ARCH}),
    preset=_preset,
    images=True,
)
