"""ColBERT in colbert-ir/colbertv2.0's layout: a BERT under "bert." and a bias-free projection "linear" in one
safetensors file; vLLM runs it as ColBERTModel, whose only output is the normalized projection of every token
(pooling task "token_embed"), scored by MaxSim summed over the query's tokens. PyLate checkpoints (a
sentence-transformers Dense module, [Q]/[D] prefixes) are recognised and refused.

Imports: errors, models (files, spec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import is_pylate
from rbln_retrieval.models.spec import Checkpoint, FamilySpec, Scoring

ARCHS = frozenset({"HF_ColBERT"})
PROJECTION = "linear.weight"  # the projection's tensor in the safetensors file


def _token_width(model_dir: Path, config: dict[str, Any]) -> int:
    """Width of the token vectors: the config's, where it names one (as vLLM reads it), else the projection's rows."""
    if dim := config.get("colbert_dim") or config.get("dim") or config.get("projection_dim"):
        return int(dim)
    from safetensors import SafetensorError, safe_open

    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with safe_open(path, framework="numpy") as weights:
                if PROJECTION in weights.keys():  # noqa: SIM118 - safe_open is not a mapping
                    return int(weights.get_slice(PROJECTION).get_shape()[0])
        except (SafetensorError, OSError):
            continue  # unreadable files are named by check_weights/unreadable_weights at engine start
    raise ModelNotSupportedError(
        f"{model_dir} is an HF_ColBERT checkpoint without its projection: no {PROJECTION!r} in its safetensors."
    )


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
        "hidden_size": _token_width(ckpt.path, ckpt.config),
    }


SPEC = FamilySpec(
    name="colbert",
    architectures=ARCHS,
    detect=_detect,
    preset=_preset,
    scoring=Scoring(compares="multi_vector"),
    outputs=("multi_vector",),
    refuse_output=(
        "{model} is a ColBERT model with no {missing}, so it cannot give output={output!r}; ask for "
        "output='multi_vector', or score and rerank with it (late interaction)."
    ),
)
