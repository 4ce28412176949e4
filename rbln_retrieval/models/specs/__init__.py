"""The family registry: one module per family, each holding its ``SPEC``. Detection asks the specs in this order
and takes the first that claims a checkpoint, so a spec that claims a subset of another's architectures (bge-m3 of
the bi-encoders', by its heads) comes first.

Adding a family: its module here, its line in SPECS and FamilyName, a test model builder in tests/model_builders.py
and a row in docs/models.md.

Imports: models (spec, specs.*).
"""

from __future__ import annotations

from typing import Literal, cast

from rbln_retrieval.models.spec import FamilySpec
from rbln_retrieval.models.specs import (
    bge_m3,
    bi_encoder,
    clip,
    colbert,
    colpali,
    cross_encoder,
    embeddinggemma,
    gte_new,
    nomic,
    qwen3_embedding,
    qwen3_reranker,
    siglip,
    splade,
)

FamilyName = Literal[
    "qwen3-embedding",
    "qwen3-reranker",
    "bi-encoder",
    "cross-encoder",
    "bge-m3",
    "gte-new",
    "nomic",
    "embeddinggemma",
    "colbert",
    "splade",
    "clip",
    "siglip",
    "colpali",
]

SPECS: tuple[FamilySpec, ...] = (
    clip.SPEC,
    siglip.SPEC,
    colpali.SPEC,
    colbert.SPEC,  # before the others: it refuses PyLate checkpoints, whatever their architecture
    cross_encoder.SPEC,
    splade.SPEC,
    qwen3_embedding.SPEC,
    qwen3_reranker.SPEC,
    gte_new.SPEC,
    nomic.SPEC,
    embeddinggemma.SPEC,
    bge_m3.SPEC,
    bi_encoder.SPEC,
)
SPECS_BY_NAME = {spec.name: spec for spec in SPECS}
# The family of a checkpoint nothing else says, of a name no spec has (a newer server's), and of ``family=`` naming
# an image-text family for a text checkpoint.
DEFAULT_SPEC = bi_encoder.SPEC


def spec_named(name: str) -> FamilySpec:
    """The spec of family ``name``; DEFAULT_SPEC for a name no spec has."""
    return SPECS_BY_NAME.get(name, DEFAULT_SPEC)


def family_name(spec: FamilySpec) -> FamilyName:
    """``spec.name`` as the FamilyName it is (tests/engine/test_family_registry.py checks SPECS against FamilyName)."""
    return cast(FamilyName, spec.name)
