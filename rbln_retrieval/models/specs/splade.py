"""SPLADE: a BERT masked-LM head whose logits become one sparse vector over the vocabulary; sparse vectors score by
their dot product.

The recipe (naver/splade, sentence-transformers' SparseEncoder): per vocabulary id, the largest
log(1 + relu(MLM logit)) over the text's tokens. Two layouts are recognized: sentence-transformers' files
(``modules.json`` holding an ``MLMTransformer`` and a ``SpladePooling`` module) and the bare transformers checkpoint
older releases are (``config.json`` naming ``BertForMaskedLM``). vLLM runs it as BertSpladeSparseEmbeddingModel
(the bundled backend's fix of its loader, rbln_retrieval.backend.graph.architectures.splade, is named in hf_overrides).

Imports: errors, models (files, spec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import read_json
from rbln_retrieval.models.spec import Checkpoint, FamilySpec, Scoring

SPLADE_ARCHS = {"BertForMaskedLM"}
# The architecture backend/graph/architectures/splade.py defines for vLLM (vLLM's own, its weight loading fixed).
SPLADE_OVERRIDES = {"architectures": ["RblnBertSpladeModel"]}
# sentence-transformers' SparseEncoder modules of a SPLADE checkpoint, by the end of their type name.
_SPLADE_MODULES = ("MLMTransformer", "SpladePooling")


def is_masked_lm(arch: str) -> bool:
    return arch.endswith("ForMaskedLM")


def is_splade(modules: list[dict[str, Any]]) -> bool:
    """sentence-transformers' SparseEncoder files with SPLADE pooling."""
    return any(m.get("type", "").endswith("SpladePooling") for m in modules)


def check_splade(model_dir: Path, arch: str, modules: list[dict[str, Any]]) -> None:
    """Refuse, in one sentence naming the item, a SPLADE checkpoint vLLM's SPLADE model cannot compute as its
    sentence-transformers files say."""
    if arch not in SPLADE_ARCHS:
        raise ModelNotSupportedError(
            f"{model_dir} has architecture {arch or 'none'!r}; rbln-retrieval runs SPLADE on BERT masked-LM "
            "checkpoints (BertForMaskedLM) only, the architecture vLLM's SPLADE model takes."
        )
    if not modules:
        return  # the bare transformers layout: the recipe's defaults (max pooling, relu)
    if not is_splade(modules):
        raise ModelNotSupportedError(
            f"{model_dir} is a BertForMaskedLM checkpoint whose sentence-transformers modules hold no SpladePooling "
            "module; rbln-retrieval runs masked-LM checkpoints as SPLADE only."
        )
    if other := [m.get("type", "?") for m in modules if not m.get("type", "").endswith(_SPLADE_MODULES)]:
        raise ModelNotSupportedError(
            f"{model_dir}'s sentence-transformers modules include {other[0]}, which rbln-retrieval does not run "
            "for SPLADE (it runs MLMTransformer followed by SpladePooling)."
        )
    pooling_dir = next(m.get("path", "") for m in modules if m.get("type", "").endswith("SpladePooling"))
    config = read_json(model_dir / pooling_dir / "config.json")
    config = config if isinstance(config, dict) else {}
    # vLLM builds its SPLADE pooler with max pooling and a single log1p; sentence-transformers' defaults agree.
    if (strategy := config.get("pooling_strategy", "max")) != "max":
        raise ModelNotSupportedError(
            f"{model_dir}'s SpladePooling has pooling_strategy {strategy!r}; rbln-retrieval runs SPLADE's max "
            "pooling only."
        )
    if (activation := config.get("activation_function", "relu")) != "relu":
        raise ModelNotSupportedError(
            f"{model_dir}'s SpladePooling has activation_function {activation!r}; rbln-retrieval runs "
            "log(1 + relu(logit)) only."
        )


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
    scoring=Scoring(compares="sparse"),
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
