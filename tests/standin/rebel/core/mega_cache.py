"""Stand-in for rebel's mega cache (test-only): the graphs the torch.compile stand-in lowered, held in memory and
written to / read from one bundle file, as vllm-rbln 0.12 saves it after warmup and loads it before the next."""

from __future__ import annotations

from typing import IO, Any

import torch

STORE: dict[str, Any] = {}  # graph key -> lowered graph
DIRS: list[str] = []  # every directory set, in order


def set_dir(path: str) -> None:
    DIRS.append(path)


def write_bundle(target: IO[bytes]) -> bool:
    if not STORE:
        return False
    torch.save(dict(STORE), target)
    return True


def read_bundle(source: IO[bytes]) -> dict[str, int] | None:
    with torch._guards.tracing(None):  # real tensors, even inside dynamo's tracing context
        STORE.update(torch.load(source, weights_only=False))
    return {"graphs": len(STORE)}
