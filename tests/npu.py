"""Options of the rbln-target engines the tests start against the stand-in compiler in tests/standin (three
buckets: each graph is lowered to ATen and checked, which costs seconds per bucket)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STANDIN = Path(__file__).resolve().parent / "standin"
RBLN_SETTINGS = {"max_num_batched_tokens": 1024, "buckets": [32, 256, 1024]}


def rbln_options(**settings: Any) -> dict[str, Any]:
    """Engine options of an rbln-target engine (framework objects with equal fields share its engine)."""
    return {
        "device": "rbln",
        "dtype": "float32",
        "engine_kwargs": {"additional_config": {"rbln_retrieval": {**RBLN_SETTINGS, **settings}}},
    }
