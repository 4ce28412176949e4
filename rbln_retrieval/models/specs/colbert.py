"""ColBERT in colbert-ir/colbertv2.0's layout: a BERT under "bert." and a bias-free projection "linear" in one
safetensors file; vLLM runs it as ColBERTModel, whose only output is the normalized projection of every token
(pooling task "token_embed"), scored by MaxSim summed over the query's tokens. PyLate checkpoints (a
sentence-transformers Dense module, [Q]/[D] prefixes) are recognised and refused.

Imports: errors, models (files, spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import colbert_dim, is_pylate
from rbln_retrieval.models.spec import Checkpoint, FamilySpec, Scoring

ARCHS = frozenset({"HF_ColBERT"})


def _detect(ckpt: Checkpoint) -> bool:
    if ckpt.arch in ARCHS:
        return True
    if is_pylate(ckpt.path, ckpt.modules):
        raise ModelNotSupportedError(
            f"{ckpt.path} is a PyLate ColBERT checkpoint ({ckpt.arch or 'no architecture'} with a Dense projection "
            "and [Q]/[D] prefixes), which rbln-retrieval does not support; ColBERT checkpoints in colbert-ir's "
            "layout (architecture HF_ColBERT) are."
        )
    return False


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    return {
        **ckpt.common(),
        "uses_token_type_ids": ckpt.uses_token_type_ids,
        "hidden_size": colbert_dim(ckpt.path, ckpt.config),
    }


SPEC = FamilySpec(
    name="colbert",
    architectures=ARCHS,
    detect=_detect,
    preset=_preset,
    scoring=Scoring.MAXSIM,
    outputs=("multi_vector",),
    refuse_output=(
        "{model} is a ColBERT model with no {missing}, so it cannot give output={output!r}; ask for "
        "output='multi_vector', or score and rerank with it (late interaction)."
    ),
)
