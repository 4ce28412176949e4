"""Cross-encoders: a sequence classifier with one relevance logit that reads each (query, document) pair.

Imports: errors, models (spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.spec import Checkpoint, FamilySpec, Scoring

ARCHS = frozenset(
    {
        "BertForSequenceClassification",
        "RobertaForSequenceClassification",
        "XLMRobertaForSequenceClassification",
        "ModernBertForSequenceClassification",
        "Qwen3ForSequenceClassification",
    }
)


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    common = ckpt.common()
    num_labels = len(ckpt.config.get("id2label") or {}) or ckpt.config.get("num_labels", 1)
    if num_labels != 1:
        raise ModelNotSupportedError(
            f"{ckpt.path} is a classifier with {num_labels} labels; a reranker needs exactly one relevance logit."
        )
    return {**common, "uses_token_type_ids": ckpt.uses_token_type_ids}


SPEC = FamilySpec(
    name="cross-encoder",
    architectures=ARCHS,
    preset=_preset,
    scoring=Scoring(compares=None, takes_instruction=False),
)
