"""What one engine asks Ray for: one RBLN NPU when the cluster has them, else CPUs."""

from __future__ import annotations

import os
from typing import Any

import ray

# Ray's RBLN accelerator manager (ray/_private/accelerators/rbln.py) schedules NPUs under this resource and sets
# the legacy RBLN_DEVICES per actor; an rbln engine folds it into SDK 0.12's RBLN_VISIBLE_DEVICES when it starts.
RBLN_RESOURCE = "RBLN"
RBLN_DEVICES_ENV = "RBLN_DEVICES"
RBLN_VISIBLE_DEVICES_ENV = "RBLN_VISIBLE_DEVICES"


def engine_resources(num_cpus: float | None = None, npus: int = 1) -> dict[str, Any]:
    """Ray remote arguments for one engine actor (or a replica of several engines on ``npus`` NPUs):
    ``{"resources": {"RBLN": npus}}`` (plus ``num_cpus`` for tokenization and the host side, default 1) when the
    connected cluster declares RBLN NPUs, else ``num_cpus`` CPUs (default 1). Connects to Ray (``ray.init()``) if
    the caller has not."""
    if not ray.is_initialized():
        ray.init()
    cpus = 1.0 if num_cpus is None else num_cpus
    if ray.cluster_resources().get(RBLN_RESOURCE, 0) >= 1:
        return {"num_cpus": cpus, "resources": {RBLN_RESOURCE: npus}}
    return {"num_cpus": cpus}


def assigned_npus() -> list[str]:
    """The NPUs Ray gave this actor (RBLN_DEVICES, or RBLN_VISIBLE_DEVICES once an engine folded it), in order."""
    given = os.environ.get(RBLN_VISIBLE_DEVICES_ENV) or os.environ.get(RBLN_DEVICES_ENV) or ""
    return [device.strip() for device in given.split(",") if device.strip()]


def announce_placement(what: str) -> None:
    """Print one line saying which NPU this actor got (as Ray set it, or as an engine already folded it); Ray
    forwards it to the driver prefixed with the actor."""
    names = (RBLN_DEVICES_ENV, RBLN_VISIBLE_DEVICES_ENV)
    found = [f"{name}={os.environ[name]}" for name in names if os.environ.get(name) is not None]
    where = found[0] if found else f"no {RBLN_RESOURCE} assigned"
    print(f"rbln-retrieval {what}: {where}", flush=True)
