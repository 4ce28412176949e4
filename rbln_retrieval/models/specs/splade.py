"""SPLADE: a BERT masked-LM head whose logits become one sparse vector over the vocabulary (the checks and the
architecture the bundled backend registers are models/splade.py's); sparse vectors score by their dot product.

Imports: models (spec, splade).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.models.spec import Checkpoint, FamilySpec, Scoring
from rbln_retrieval.models.splade import SPLADE_ARCHS, SPLADE_OVERRIDES, check_splade, is_masked_lm


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    common = ckpt.common()
    check_splade(ckpt.path, ckpt.arch, ckpt.modules)
    return {
        **common,
        "normalize": False,
        "query_prompt": ckpt.query_prompt(),
        "document_prompt": ckpt.document_prompt(),
        "uses_token_type_ids": ckpt.uses_token_type_ids,
        # The sparse vector spans the vocabulary.
        "hidden_size": int(ckpt.config.get("vocab_size", 0)),
        "hf_overrides": SPLADE_OVERRIDES,
    }


SPEC = FamilySpec(
    name="splade",
    architectures=frozenset(SPLADE_ARCHS),
    # What a retrieval engine computes from a masked-LM head; check_splade refuses the rest.
    detect=lambda ckpt: is_masked_lm(ckpt.arch),
    preset=_preset,
    scoring=Scoring.SPARSE_DOT,
    outputs=("sparse",),
    vocabulary_row=True,
    bundled_model=SPLADE_OVERRIDES["architectures"][0],
    refuse_output=(
        "{model} is a SPLADE model: it gives one sparse vector per text and no other output, so it cannot give "
        "output={output!r}; ask for output='sparse'."
    ),
    npu_note=(
        "sparse vectors are pooled by vLLM's pooler on the host from the graph's hidden states (the masked-LM head "
        "and the max over tokens, one request at a time)."
    ),
)
