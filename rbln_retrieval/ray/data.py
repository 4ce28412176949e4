"""Bulk embedding and pair scoring of a Ray Data dataset on a pool of actors, one PoolingEngine each.

Ray Data streams blocks through the pool, so memory stays bounded however large the dataset. Each actor holds one
engine for its lifetime (an engine start costs seconds); when an actor dies, Ray restarts it and retries the
batch it held, and the dead attempt's output is dropped, so every row comes out exactly once.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import ray.data

from rbln_retrieval.local.engine import PoolingEngine
from rbln_retrieval.ray.resources import announce_placement, engine_resources

DEFAULT_BATCH_SIZE = 256
DEFAULT_ACTORS = 1


def embed_dataset(
    dataset: ray.data.Dataset,
    model: str,
    *,
    column: str = "text",
    output_column: str = "embedding",
    kind: Literal["document", "query"] = "document",
    instruction: str | None = None,
    dimensions: int | None = None,
    actors: int = DEFAULT_ACTORS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    num_cpus: float | None = None,
    max_restarts: int = -1,
    ray_remote_args: dict[str, Any] | None = None,
    **engine_options: Any,
) -> ray.data.Dataset:
    """``dataset`` with ``output_column`` added: the float32 embedding of ``column`` in every row (other columns
    pass through). Lazy, like every Ray Data transform: it runs when the result is consumed or written.

    ``actors`` engines, each on one RBLN NPU when the cluster declares ``RBLN`` resources, else on ``num_cpus``
    CPUs (default 1); ``engine_options`` go to ``PoolingEngine`` (``device``, ``dtype``, ``max_length``, ...).
    ``max_restarts`` bounds restarts of a dead actor (-1: unlimited); its batch is retried on the restarted one.
    Rows stream in completion order unless ``DataContext.get_current().execution_options.preserve_order`` is set.
    """
    _check_pool(actors, batch_size)
    call = {"kind": kind, "instruction": instruction, "dimensions": dimensions}
    return _map(
        dataset,
        _Embedder,
        (model, engine_options, column, output_column, call),
        actors=actors,
        batch_size=batch_size,
        num_cpus=num_cpus,
        max_restarts=max_restarts,
        ray_remote_args=ray_remote_args,
    )


def score_dataset(
    dataset: ray.data.Dataset,
    model: str,
    *,
    query_column: str = "query",
    document_column: str = "document",
    output_column: str = "score",
    instruction: str | None = None,
    actors: int = DEFAULT_ACTORS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    num_cpus: float | None = None,
    max_restarts: int = -1,
    ray_remote_args: dict[str, Any] | None = None,
    **engine_options: Any,
) -> ray.data.Dataset:
    """``dataset`` with ``output_column`` added: the relevance score of each row's (query, document) pair, as
    ``PoolingEngine.score`` gives it (a reranker's probability; a bi-encoder's cosine). Same pool, resources and
    retries as ``embed_dataset``."""
    _check_pool(actors, batch_size)
    args = (model, engine_options, query_column, document_column, output_column, instruction)
    return _map(
        dataset,
        _Scorer,
        args,
        actors=actors,
        batch_size=batch_size,
        num_cpus=num_cpus,
        max_restarts=max_restarts,
        ray_remote_args=ray_remote_args,
    )


def _check_pool(actors: int, batch_size: int) -> None:
    if isinstance(actors, bool) or not isinstance(actors, int) or actors < 1:
        raise ValueError(f"actors={actors!r} must be a positive integer.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer.")


def _map(
    dataset: ray.data.Dataset,
    actor: type,
    args: tuple[Any, ...],
    *,
    actors: int,
    batch_size: int,
    num_cpus: float | None,
    max_restarts: int,
    ray_remote_args: dict[str, Any] | None,
) -> ray.data.Dataset:
    if not isinstance(dataset, ray.data.Dataset):
        raise TypeError(f"dataset is {type(dataset).__name__}, expected a ray.data.Dataset.")
    remote_args = {**engine_resources(num_cpus), **(ray_remote_args or {})}
    # A retried batch must wait for its restarted actor rather than fail the run: retry actor tasks as long as
    # the actor may restart.
    remote_args.setdefault("max_restarts", max_restarts)
    remote_args.setdefault("max_task_retries", -1 if max_restarts != 0 else 0)
    return dataset.map_batches(
        actor,
        fn_constructor_args=args,
        batch_size=batch_size,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(size=actors),
        **remote_args,
    )


def _column(batch: dict[str, np.ndarray], name: str) -> list[str]:
    if name not in batch:
        raise ValueError(f"The dataset has no column {name!r} (columns: {', '.join(sorted(batch))}).")
    values = batch[name].tolist()
    for value in values:
        if not isinstance(value, str):
            raise TypeError(f"Column {name!r} holds a {type(value).__name__} ({value!r:.60}); expected str.")
    return values


class _Embedder:
    """One engine per actor, kept for the actor's life."""

    def __init__(
        self, model: str, engine_options: dict[str, Any], column: str, output_column: str, call: dict[str, Any]
    ):
        announce_placement("embedding actor")
        self.engine = PoolingEngine(model, **engine_options)
        self.column, self.output_column, self.call = column, output_column, call

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch[self.output_column] = self.engine.embed(_column(batch, self.column), **self.call)
        return batch


class _Scorer:
    def __init__(
        self,
        model: str,
        engine_options: dict[str, Any],
        query_column: str,
        document_column: str,
        output_column: str,
        instruction: str | None,
    ):
        announce_placement("scoring actor")
        self.engine = PoolingEngine(model, **engine_options)
        self.query_column, self.document_column = query_column, document_column
        self.output_column, self.instruction = output_column, instruction

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        queries, documents = _column(batch, self.query_column), _column(batch, self.document_column)
        # One engine call per distinct query in the batch (score takes one query and many documents).
        rows_by_query: dict[str, list[int]] = {}
        for row, query in enumerate(queries):
            rows_by_query.setdefault(query, []).append(row)
        scores = np.empty(len(queries), dtype=np.float32)
        for query, rows in rows_by_query.items():
            scores[rows] = self.engine.score(query, [documents[r] for r in rows], instruction=self.instruction)
        batch[self.output_column] = scores
        return batch
