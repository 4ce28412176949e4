"""bge-m3 (BAAI/bge-m3): an XLM-R bi-encoder that ships its sparse and ColBERT heads beside the weights; vLLM runs
all three outputs as BgeM3EmbeddingModel. Its MaxSim averages over the query's tokens (FlagEmbedding's
``colbert_score``), and its heads exist only as .pt state dicts.

Imports: errors, models (spec, specs.bi_encoder).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.spec import OUTPUTS, Checkpoint, FamilySpec
from rbln_retrieval.models.specs.bi_encoder import ARCHS, encoder_preset

BGE_M3_HEADS = ("sparse_linear.pt", "colbert_linear.pt")
BGE_M3_OVERRIDES = {"architectures": ["BgeM3EmbeddingModel"]}


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    common = ckpt.common()
    if missing := [head for head in BGE_M3_HEADS if not (ckpt.path / head).is_file()]:
        raise ModelNotSupportedError(f"{ckpt.path} is not a bge-m3 checkpoint: it lacks {', '.join(missing)}.")
    return encoder_preset(ckpt, {**common, "hf_overrides": {**common["hf_overrides"], **BGE_M3_OVERRIDES}})


SPEC = FamilySpec(
    name="bge-m3",
    architectures=ARCHS,
    detect=lambda ckpt: ckpt.arch in ARCHS and all((ckpt.path / head).is_file() for head in BGE_M3_HEADS),
    preset=_preset,
    outputs=OUTPUTS,
    maxsim_reduction="mean",
    loads_pickle_heads=True,
    head_files=BGE_M3_HEADS,
)
