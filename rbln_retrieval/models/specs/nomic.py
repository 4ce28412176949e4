"""Nomic (nomic-embed-text-v1/v1.5): config class ``NomicBertModel`` shipped as code; every text carries one of its
task prefixes (its model card), mean pooling, and (v1.5) matryoshka sizes 768..64.

Imports: models (spec, specs.remote_code).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.models.spec import Checkpoint, FamilySpec
from rbln_retrieval.models.specs.remote_code import remote_code_preset

ARCH = "NomicBertModel"
NOMIC_QUERY_PREFIX = "search_query: "
NOMIC_DOCUMENT_PREFIX = "search_document: "


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    # Nomic's configs lack vLLM's matryoshka flag.
    return remote_code_preset(ckpt, SPEC, pooling="MEAN", overrides={"is_matryoshka": True})


SPEC = FamilySpec(
    name="nomic",
    architectures=frozenset({ARCH}),
    preset=_preset,
    query_prompt=NOMIC_QUERY_PREFIX,
    document_prompt=NOMIC_DOCUMENT_PREFIX,
    matryoshka=True,
)
