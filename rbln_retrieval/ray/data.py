"""Bulk embedding and pair scoring of a Ray Data dataset on a pool of actors, one PoolingEngine each.

Ray Data streams blocks through the pool, so memory stays bounded however large the dataset. Each actor holds one
engine for its lifetime (an engine start costs seconds); when an actor dies, Ray restarts it and retries the
batch it held, and the dead attempt's output is dropped, so every row comes out exactly once. A batch that kills
its actor every time (one that runs it out of memory) is tried ``max_batch_attempts`` times, counted by a small
actor of the job, and then fails the job in one sentence naming its rows (BatchFailedError), never retried forever.
A batch is known by its content (the batch's retry on a restarted actor keeps no task identity a count could key
on); its count is its attempts started and not finished, so a finished identical batch takes
back only its own attempt, and up to one attempt per actor may be in flight before deaths are counted: identical
rows in batches of several actors at once are not mistaken for deaths, and a batch that kills every actor it meets
is tried at most ``max_batch_attempts + actors - 1`` times. Actors that die in their constructor are bounded too:
past ``max_batch_attempts`` deaths per actor, the next constructor raises BatchFailedError instead of being
restarted forever.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, Literal

import numpy as np
import ray
import ray.data

from rbln_retrieval.local.engine import PoolingEngine
from rbln_retrieval.ray.resources import announce_placement, engine_resources

DEFAULT_BATCH_SIZE = 256
DEFAULT_ACTORS = 1
DEFAULT_BATCH_ATTEMPTS = 3


class BatchFailedError(RuntimeError):
    """A batch was started ``max_batch_attempts`` times and its actor died under it every time."""


@ray.remote(num_cpus=0)
class _BatchAttempts:
    """How many times each batch in flight was started without finishing (its actor died under it), and how many
    actor constructors were started without finishing."""

    def __init__(self) -> None:
        self.started: dict[str, int] = {}
        self.constructors = 0  # started and not finished: running now, or died

    def start(self, key: str) -> int:
        self.started[key] = self.started.get(key, 0) + 1
        return self.started[key]

    def finish(self, key: str) -> None:
        left = self.started.get(key, 0) - 1
        if left > 0:
            self.started[key] = left
        else:
            self.started.pop(key, None)

    def construct(self) -> int:
        self.constructors += 1
        return self.constructors

    def constructed(self) -> None:
        self.constructors -= 1

    def pending(self) -> dict[str, int]:
        """The batches started and not finished, with their attempts so far (what a monitor of the job reads)."""
        return dict(self.started)


def _attempts_counter() -> Any:
    """A new job's counter, named so that a monitor of the job can find it."""
    return _BatchAttempts.options(  # type: ignore[attr-defined]
        name=f"rbln-retrieval-batch-attempts-{uuid.uuid4().hex[:12]}"
    ).remote()


class _BatchGuard:
    """Counts the attempts at each batch of one job (by its content: its attempts started and not finished) and at
    the actors' constructors in ``attempts``, for a pool of ``actors``."""

    def __init__(self, attempts: Any, max_attempts: int, columns: tuple[str, ...], actors: int) -> None:
        self.attempts, self.max_attempts, self.columns, self.actors = attempts, max_attempts, columns, actors

    def construct(self) -> None:
        """Count a constructor's start; BatchFailedError once the constructors started and not finished exceed
        what ``actors`` actors starting at once and ``max_attempts`` deaths each account for."""
        started = ray.get(self.attempts.construct.remote())
        if started > self.actors * (1 + self.max_attempts):
            raise BatchFailedError(
                f"The job's actors died in their constructor {started - self.actors} times (out of memory, a crash "
                "loading the engine), so the job stops instead of restarting them forever; check that one engine "
                "starts on its own with these options."
            )

    def constructed(self) -> None:
        self.attempts.constructed.remote()

    def start(self, batch: dict[str, np.ndarray]) -> str:
        """The batch's key, after counting this attempt; BatchFailedError once it is over ``max_attempts``."""
        digest = hashlib.sha256()
        for name in self.columns:
            for value in batch[name].tolist() if name in batch else []:
                digest.update(f"{value}\x00".encode(errors="surrogatepass"))
        key = digest.hexdigest()
        started = ray.get(self.attempts.start.remote(key))
        # One attempt per actor may be in flight on a live actor (identical batches at once); past those, each
        # attempt not finished is one its actor died under.
        if started > self.max_attempts + self.actors - 1:
            raise BatchFailedError(
                f"The batch of {_rows(batch, self.columns[0])} was started {self.max_attempts} times and its actor "
                "died under it every time (out of memory, or a crash in the engine), so the job stops instead of "
                "retrying it forever; process those rows with a smaller batch_size or on their own."
            )
        return key

    def finish(self, key: str) -> None:
        self.attempts.finish.remote(key)


def _rows(batch: dict[str, np.ndarray], column: str) -> str:
    """The rows of ``batch`` named by an ``id`` column where the dataset has one, else by their first text."""
    count = len(next(iter(batch.values()))) if batch else 0
    if "id" in batch and count:
        ids = batch["id"].tolist()
        return f"{count} rows with id {ids[0]}" if count == 1 else f"{count} rows with ids {ids[0]} to {ids[-1]}"
    first = str(batch[column][0]) if column in batch and count else ""
    return f"{count} rows starting with {column}={first[:60]!r}"


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
    max_batch_attempts: int = DEFAULT_BATCH_ATTEMPTS,
    ray_remote_args: dict[str, Any] | None = None,
    **engine_options: Any,
) -> ray.data.Dataset:
    """``dataset`` with ``output_column`` added: the float32 embedding of ``column`` in every row (other columns
    pass through). Lazy, like every Ray Data transform: it runs when the result is consumed or written.

    ``actors`` engines, each on one RBLN NPU when the cluster declares ``RBLN`` resources, else on ``num_cpus``
    CPUs (default 1); ``engine_options`` go to ``PoolingEngine`` (``device``, ``dtype``, ``max_length``, ...).
    ``max_restarts`` bounds restarts of a dead actor (-1: unlimited); its batch is retried on the restarted one, up
    to ``max_batch_attempts`` attempts in all, after which the job fails with BatchFailedError naming its rows.
    Rows stream in completion order unless ``DataContext.get_current().execution_options.preserve_order`` is set.
    """
    _check_pool(actors, batch_size, max_batch_attempts)
    call = {"kind": kind, "instruction": instruction, "dimensions": dimensions}
    return _map(
        dataset,
        _Embedder,
        (model, engine_options, column, output_column, call),
        actors=actors,
        batch_size=batch_size,
        num_cpus=num_cpus,
        max_restarts=max_restarts,
        guard=(max_batch_attempts, (column,)),
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
    max_batch_attempts: int = DEFAULT_BATCH_ATTEMPTS,
    ray_remote_args: dict[str, Any] | None = None,
    **engine_options: Any,
) -> ray.data.Dataset:
    """``dataset`` with ``output_column`` added: the relevance score of each row's (query, document) pair, as
    ``PoolingEngine.score`` gives it (a reranker's probability; a bi-encoder's cosine). Same pool, resources and
    retries as ``embed_dataset``."""
    _check_pool(actors, batch_size, max_batch_attempts)
    args = (model, engine_options, query_column, document_column, output_column, instruction)
    return _map(
        dataset,
        _Scorer,
        args,
        actors=actors,
        batch_size=batch_size,
        num_cpus=num_cpus,
        max_restarts=max_restarts,
        guard=(max_batch_attempts, (query_column, document_column)),
        ray_remote_args=ray_remote_args,
    )


def _check_pool(actors: int, batch_size: int, max_batch_attempts: int) -> None:
    for name, value in (("actors", actors), ("batch_size", batch_size), ("max_batch_attempts", max_batch_attempts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer.")


def _map(
    dataset: ray.data.Dataset,
    actor: type,
    args: tuple[Any, ...],
    *,
    actors: int,
    batch_size: int,
    num_cpus: float | None,
    max_restarts: int,
    guard: tuple[int, tuple[str, ...]],
    ray_remote_args: dict[str, Any] | None,
) -> ray.data.Dataset:
    if not isinstance(dataset, ray.data.Dataset):
        raise TypeError(f"dataset is {type(dataset).__name__}, expected a ray.data.Dataset.")
    remote_args = {**engine_resources(num_cpus), **(ray_remote_args or {})}
    # A retried batch must wait for its restarted actor rather than fail the run: retry actor tasks as long as
    # the actor may restart.
    remote_args.setdefault("max_restarts", max_restarts)
    remote_args.setdefault("max_task_retries", -1 if max_restarts != 0 else 0)
    max_attempts, columns = guard
    return dataset.map_batches(
        actor,
        fn_constructor_args=(_BatchGuard(_attempts_counter(), max_attempts, columns, actors), *args),
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


class _Guarded:
    """An actor whose every batch is counted by its job's guard, so that one its actor never survives ends the job."""

    def __init__(self, guard: _BatchGuard) -> None:
        self.guard = guard
        guard.construct()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        key = self.guard.start(batch)
        out = self.process(batch)
        self.guard.finish(key)
        return out

    def process(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError


class _Embedder(_Guarded):
    """One engine per actor, kept for the actor's life."""

    def __init__(
        self,
        guard: _BatchGuard,
        model: str,
        engine_options: dict[str, Any],
        column: str,
        output_column: str,
        call: dict[str, Any],
    ):
        super().__init__(guard)
        announce_placement("embedding actor")
        self.engine = PoolingEngine(model, **engine_options)
        self.column, self.output_column, self.call = column, output_column, call
        guard.constructed()

    def process(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        batch[self.output_column] = self.engine.embed(_column(batch, self.column), **self.call)
        return batch


class _Scorer(_Guarded):
    def __init__(
        self,
        guard: _BatchGuard,
        model: str,
        engine_options: dict[str, Any],
        query_column: str,
        document_column: str,
        output_column: str,
        instruction: str | None,
    ):
        super().__init__(guard)
        announce_placement("scoring actor")
        self.engine = PoolingEngine(model, **engine_options)
        self.query_column, self.document_column = query_column, document_column
        self.output_column, self.instruction = output_column, instruction
        guard.constructed()

    def process(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
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
