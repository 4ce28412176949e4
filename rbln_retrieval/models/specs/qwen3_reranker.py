"""Qwen3-Reranker: the bare Qwen3 causal LM (no pooling module) whose yes/no logits after its chat template are the
relevance score; the template lives here only.

Imports: models (spec, specs.qwen3_embedding).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.models.spec import Checkpoint, FamilySpec, PairTemplate, Scoring
from rbln_retrieval.models.specs.qwen3_embedding import QWEN3_ARCHS, QWEN3_DEFAULT_TASK

QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_RERANKER_PAIR = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
# vLLM turns the causal LM's vocabulary head into one row, logit(yes) - logit(no); sigmoid of it is P(yes).
QWEN3_RERANKER_OVERRIDES = {
    "architectures": ["Qwen3ForSequenceClassification"],
    "classifier_from_token": ["no", "yes"],
    "is_original_qwen3_reranker": True,
}


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    common = ckpt.common()
    return {
        **common,
        "default_instruction": QWEN3_DEFAULT_TASK,
        "kv_bytes_per_token": ckpt.kv_bytes_per_token(),
        "hf_overrides": {**common["hf_overrides"], **QWEN3_RERANKER_OVERRIDES},
    }


SPEC = FamilySpec(
    name="qwen3-reranker",
    architectures=QWEN3_ARCHS,
    detect=lambda ckpt: ckpt.arch in QWEN3_ARCHS and ckpt.pooling is None,
    preset=_preset,
    scoring=Scoring(compares=None),
    default_instruction=QWEN3_DEFAULT_TASK,
    pair_template=PairTemplate(QWEN3_RERANKER_PREFIX, QWEN3_RERANKER_PAIR, QWEN3_RERANKER_SUFFIX),
)
