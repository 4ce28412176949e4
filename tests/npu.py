"""Options of the rbln-target engines the tests start against the stand-in compiler in tests/standin (three
shapes, 1x64, 4x256 and 1x512: each graph is lowered to ATen and checked, which costs seconds per graph), one NPU
per family."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

STANDIN = Path(__file__).resolve().parent / "standin"
RBLN_SETTINGS = {"shapes": [[1, 64], [4, 256], [1, 512]]}
# ATOM compiles through rebel.compile_from_torch, Rebel100 through torch.compile (rbln_runtime.family_of).
NPUS = ("RBLN-CA25", "RBLN-CR13")


def rbln_options(npu: str = "RBLN-CA25", *, default_shapes: bool = False, **settings: Any) -> dict[str, Any]:
    """Engine options of an rbln-target engine for ``npu`` (framework objects with equal fields share its engine);
    ``default_shapes``: the shapes the engine derives, as a user gets them, instead of the tests' three."""
    base = {} if default_shapes else RBLN_SETTINGS
    return {
        "device": "rbln",
        "dtype": "float32",
        "engine_kwargs": {"additional_config": {"rbln_retrieval": {**base, "npu": npu, **settings}}},
    }


def start_rbln(
    path: Path, npu: str, *, default_shapes: bool = False, settings: dict[str, Any] | None = None, **options: Any
) -> Any:
    """A shared rbln-target engine for ``npu`` that compiles afresh: a compile cache of its own (under the
    session's) and the stand-in's in-memory compile cache emptied, as in a new process on a new host;
    ``settings``: the runner's, over the tests' (e.g. other shapes)."""
    from rbln_retrieval import PoolingEngine

    if (mega_cache := sys.modules.get("rebel.core.mega_cache")) is not None:
        mega_cache.STORE.clear()
    base = os.environ["RBLN_RETRIEVAL_CACHE_DIR"]
    os.environ["RBLN_RETRIEVAL_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"{npu}-", dir=base)
    try:
        return PoolingEngine.shared(
            path, **rbln_options(npu, default_shapes=default_shapes, **(settings or {})), **options
        )
    finally:
        os.environ["RBLN_RETRIEVAL_CACHE_DIR"] = base
