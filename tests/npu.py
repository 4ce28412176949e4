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


HOST_SYNC_OPS = ("aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.unique")


def checked_graphs(engine: Any, compiled: list[Any], labels: list[str], name: str) -> list[tuple[str, Any]]:
    """(label, graph) of each graph the stand-in lowered for ``engine``, after checking that they are ``labels``,
    each compiled once during warmup, and each what an NPU takes: static, ATen only, no host-synchronising op, no
    int64 input, 64-aligned inputs, weights as state, its FLOPs counted (printed with ``name``)."""
    stats = engine.stats()
    got = [g["bucket"] for g in stats["graphs"]]
    assert sorted(got) == sorted(labels), "one graph per step shape and image bucket"
    assert stats["compiles"] == len(compiled) == len(got) and stats["compiles_after_warmup"] == 0
    assert stats["graph_breaks"] == 0 and all(g["lifted_weights"] == 0 for g in stats["graphs"])
    for label, graph in zip(got, compiled):
        print(f"{name} {stats['npu']} {label}: {graph.input_shapes} {graph.flops / 1e6:.2f} MFLOP")
        assert graph.violations == [] and not graph.cached and graph.flops > 0
        assert {op.split(".")[0] for op in graph.ops} <= {"aten", "prims"}
        assert not [op for op in graph.ops if op.startswith(HOST_SYNC_OPS)], label
        assert "torch.int64" not in graph.input_dtypes and all(s and s[-1] % 64 == 0 for s in graph.input_shapes)
    return list(zip(got, compiled))
