"""The server's own request metrics on /metrics, labeled by the served model a request was answered by (served.py's
pick), its route and its status: a server of several models tells each model's traffic and latency apart.

A request that no model answered (refused before its handler picked one: a bad body, an unknown model) is labeled
with an empty model. Registered once per process in prometheus_client's default registry, which /metrics exposes.

Imports: prometheus_client.
"""

from __future__ import annotations

from functools import cache
from typing import Any

LABELS = ("model", "route", "status")


@cache
def _instruments() -> tuple[Any, Any]:
    from prometheus_client import Counter, Histogram

    requests = Counter("rbln_retrieval_requests", "Requests answered, by served model, route and status.", LABELS)
    seconds = Histogram(
        "rbln_retrieval_request_seconds", "Seconds from a request's arrival to its answer, by served model.", LABELS
    )
    return requests, seconds


def observe(model: str | None, route: str, status: int, seconds: float) -> None:
    """Count one answered request of ``model`` (None: no model picked) on ``route`` and its latency."""
    requests, latency = _instruments()
    labels = {"model": model or "", "route": route, "status": str(status)}
    requests.labels(**labels).inc()
    latency.labels(**labels).observe(seconds)
