"""Bi-encoders: a BERT-like encoder with sentence-transformers pooling (and any Dense layers), cosine scores; the
family of a checkpoint nothing else claims among these architectures.

Imports: models (files, spec).
"""

from __future__ import annotations

import logging
from typing import Any

from rbln_retrieval.models.files import dense_output_width
from rbln_retrieval.models.spec import Checkpoint, FamilySpec

logger = logging.getLogger(__name__)

ARCHS = frozenset({"BertModel", "RobertaModel", "XLMRobertaModel", "ModernBertModel"})


def encoder_preset(ckpt: Checkpoint, common: dict[str, Any]) -> dict[str, Any]:
    """The fields of a sentence-transformers encoder (bi-encoder, bge-m3) given its ``common`` fields."""
    pooling = ckpt.pooling
    if pooling is None:
        # sentence-transformers' own default when a checkpoint ships no pooling module.
        logger.info("%s declares no pooling module; using mean pooling as sentence-transformers does.", ckpt.path)
        pooling = "MEAN"
    return {
        **common,
        "pooling": pooling,
        "normalize": ckpt.normalizes,
        "query_prompt": ckpt.query_prompt(),
        "document_prompt": ckpt.document_prompt(),
        "uses_token_type_ids": ckpt.uses_token_type_ids,
        # vLLM's embedding head applies a checkpoint's sentence-transformers Dense layers: they set the width.
        "hidden_size": dense_output_width(ckpt.path, ckpt.modules, common["hidden_size"]),
    }


SPEC = FamilySpec(
    name="bi-encoder",
    architectures=ARCHS,
    preset=lambda ckpt: encoder_preset(ckpt, ckpt.common()),
)
