"""GTE-new (Alibaba-NLP/gte-*-v1.5, gte-multilingual-base): config class ``NewModel`` shipped as code; vLLM runs it
as GteNewModel, CLS pooling unless the checkpoint says otherwise.

Imports: models (spec, specs.remote_code).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.models.spec import Checkpoint, FamilySpec
from rbln_retrieval.models.specs.remote_code import remote_code_preset

ARCH = "NewModel"
GTE_NEW_OVERRIDES = {"architectures": ["GteNewModel"]}


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    return remote_code_preset(ckpt, SPEC, pooling="CLS", overrides=GTE_NEW_OVERRIDES)


SPEC = FamilySpec(
    name="gte-new",
    architectures=frozenset({ARCH}),
    preset=_preset,
)
