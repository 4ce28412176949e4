"""What GTE-new and Nomic share: BERT-like encoders with rope whose config class ships as code (config.json's
auto_map). vLLM asserts that class by name, so they need trust_remote_code (models.families.check_remote_code).

Imports: errors, models (spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.errors import ModelNotSupportedError
from rbln_retrieval.models.files import Pooling
from rbln_retrieval.models.spec import Checkpoint, FamilySpec


def remote_code_preset(
    ckpt: Checkpoint, spec: FamilySpec, *, pooling: Pooling, overrides: dict[str, Any]
) -> dict[str, Any]:
    """The fields of a remote-code encoder: ``pooling`` unless the checkpoint declares its own, ``overrides`` added
    to the config fixes, the spec's default prompts unless the checkpoint declares its own."""
    common = ckpt.common()
    config_code = (ckpt.config.get("auto_map") or {}).get("AutoConfig")
    if not config_code:
        raise ModelNotSupportedError(
            f"{ckpt.path} is a {ckpt.arch} checkpoint without an auto_map AutoConfig entry naming the "
            "config class it ships as code."
        )
    return {
        **common,
        "pooling": ckpt.pooling or pooling,
        "query_prompt": ckpt.query_prompt(spec.query_prompt),
        "document_prompt": ckpt.document_prompt(spec.document_prompt),
        "matryoshka": spec.matryoshka,
        "uses_token_type_ids": ckpt.uses_token_type_ids,
        "config_code": config_code,
        "hf_overrides": {**common["hf_overrides"], **overrides},
    }
