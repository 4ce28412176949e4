"""SigLIP (``SiglipModel``): images and texts into one space; a text is padded to the text tower's length and its
last position pooled, as SigLIP was trained (vLLM's SigLIP reverses each text so that its last position comes
first: CLS pooling).

Imports: errors, models (multimodal, spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.spec import Checkpoint, FamilySpec
from rbln_retrieval.models.specs.image_text import tower_fields

ARCH = "SiglipModel"


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    text, vision, fields = tower_fields(ckpt)
    width = int(vision.get("hidden_size") or 0)
    text_out = int(text.get("projection_size") or text["hidden_size"])
    if text_out != width:
        raise ModelNotSupportedError(
            f"{ckpt.path}'s SigLIP towers give vectors of different widths (text {text_out}, image {width})."
        )
    return {**fields, "hidden_size": width, "pooling": "CLS", "pad_text_to_max_length": True}


SPEC = FamilySpec(
    name="siglip",
    architectures=frozenset({ARCH}),
    preset=_preset,
    images=True,
)
