"""The table of served models: the name a request's ``model`` field gives -> the engine that answers it.

Every route finds its engine here. A request naming a model gets that model (an unknown name is refused naming the
served ones); a request without a model field (TEI's routes, a Cohere or OpenAI request that leaves it out) gets the
only served model that can answer the route: the only embedder for embedding routes, the only scorer (a reranker,
or a bi-encoder scoring by its vectors) for scoring routes, and of several scorers the only reranker (a
cross-encoder), since a rerank request without a model (TEI's /rerank) means the reranker; when several could still
answer, the request must name one. `rbln-retrieval serve MODEL [MODEL ...]` fills the table with one entry a model.

A model with bounds of its own (limits.py's Gate) admits a request when the request picks it: past its bounds the
pick is refused naming the model, and the request gives its slot back when it is answered (release()).

Imports: engines (protocol), models (families), server (check, limits).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rbln_retrieval.engines.protocol import RetrievalEngine
from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.server.check import Refused
from rbln_retrieval.server.limits import Gate

# What a route needs of its model: vectors of texts or images, scores of documents against a query, or just a model.
Role = Literal["embed", "score", "any"]


@dataclass(frozen=True)
class Served:
    """One served model: the name clients use, its engine, its description (GET DESCRIBE_PATH) and its own bounds
    (None: the server's only)."""

    name: str
    engine: RetrievalEngine
    description: dict[str, Any]
    gate: Gate | None = None

    @property
    def family(self) -> ModelFamily:
        return self.engine.family

    def can(self, role: Role) -> bool:
        """Whether this model can answer a route of ``role``: a reranker does not embed; every model scores."""
        return role != "embed" or not self.family.is_cross_encoder


class ServedModels(Mapping[str, Served]):
    """Served models by name, in the order they were given."""

    def __init__(self, models: list[Served]):
        if not models:
            raise ValueError("A server needs at least one model.")
        self._models = {model.name: model for model in models}
        self.picked: str | None = None  # the model a request's pick() chose (metrics.py labels by it)
        self._request: tuple[str, bytes] | None = None
        self._held: tuple[Gate, int] | None = None

    def for_request(self, path: str, body: bytes | None) -> ServedModels:
        """The same table for one request (a POST of ``body`` to ``path``; None: a GET), recording the model its
        handler picks and what it holds of that model's bounds until release()."""
        table = ServedModels.__new__(ServedModels)
        table._models, table.picked, table._held = self._models, None, None
        table._request = None if body is None else (path, body)
        return table

    def release(self) -> None:
        """Give back the slot the request's pick took of its model's bounds, once it is answered."""
        if self._held is not None:
            gate, tokens = self._held
            self._held = None
            gate.release(tokens)

    def __getitem__(self, name: str) -> Served:
        return self._models[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def pick(self, name: str | None, role: Role) -> Served:
        """The model a request names (``name``), or the only one able to answer a route of ``role``; else Refused
        (404 for an unknown name, the route's wrong-model status for a model that cannot answer it)."""
        served = self._pick(name, role)
        self.picked = served.name
        if served.gate is not None and self._request is not None and self._held is None:
            self._held = served.gate, served.gate.admit(*self._request)
        return served

    def _pick(self, name: str | None, role: Role) -> Served:
        if name is not None:
            served = self._models.get(name)
            if served is None:
                names = ", ".join(map(repr, self._models))
                raise Refused(f"The model {name!r} is not served here; this server serves {names}.", "not_found")
            if not served.can(role):
                raise Refused(_cannot(served, role), "wrong_model")
            return served
        able = [served for served in self._models.values() if served.can(role)]
        if len(able) > 1 and role == "score":
            rerankers = [served for served in able if served.family.is_cross_encoder]
            able = rerankers if len(rerankers) == 1 else able
        if len(able) == 1:
            return able[0]
        if not able:
            raise Refused(_cannot(next(iter(self._models.values())), role), "wrong_model")
        names = ", ".join(served.name for served in able)
        raise Refused(f"Several served models can answer this route ({names}); name one in `model`.", "validation")


def _cannot(served: Served, role: Role) -> str:
    return (
        f"{served.name} is a reranker ({served.family.name}); it scores query-document pairs and gives no "
        "embeddings: use /rerank or /v2/rerank."
        if role == "embed"
        else f"{served.name} cannot answer this route."
    )
