"""One model as `rbln-retrieval serve` replicas serve it, seen from RemoteEngine: its family and the name the
replicas serve it under.

The server describes its model (family, prompts, dimensions, max length) on ``DESCRIBE_PATH``; the client reads it
from every replica once, so a client that has only the model's name applies prompts and templates exactly as local
mode does. A description that cannot be read (a proxy's 502, a rolling restart) is retried within the call's
deadline and then fails the call: the client never guesses a family. Replicas that describe different models are
refused (ReplicaMismatchError), and so is an answer naming another model. A plain vLLM server has no description
route (HTTP 404): the family then comes from the model's config files where the client can read them, else from an
explicit family or the bi-encoder defaults, with a warning. The description also advertises the server's limits,
under which calls are cut into batches here.

The description carries the family by name; this side asks the family's spec (models/specs/) by that name.

Imports: engines (options, protocol), errors, models (families, source, specs), remote (replicas), text (tokens).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.engines.protocol import DESCRIBE_PATH, OUTPUTS_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.errors import ModelNotFoundError, ModelNotSupportedError
from rbln_retrieval.models.families import ModelFamily, detect_family
from rbln_retrieval.models.source import resolve_model, split_reference
from rbln_retrieval.models.specs import DEFAULT_SPEC, SPECS_BY_NAME, family_name, spec_named
from rbln_retrieval.remote.replicas import Deadline, RemoteError, Replicas
from rbln_retrieval.text.tokens import PromptTokenizer

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Bytes a server counts as one token when it bounds queued tokens (rbln_retrieval.server.limits.TOKEN_BYTES), and
# what a request's body holds beside its inputs (model name, options): both kept clear of the server's bounds.
TOKEN_BYTES = 4
BODY_RESERVE = 4096
# Inputs per request a server takes when its description does not say (the server's documented default).
MAX_INPUTS_PER_REQUEST = 2048
# The description's fingerprint of the served weights (rbln_retrieval.models.files): replicas of one model name whose
# weights differ (two revisions, a fine-tune saved in place) are refused.
WEIGHTS = "weights"


class ReplicaMismatchError(RemoteError):
    """The replicas behind the base URLs serve different models (or versions of one): their vectors and scores
    must not be mixed in one call."""


class RemoteModel:
    """The family (an explicit ``family`` option must agree with the server's and stands in where the server gives
    none) and the served name, each asked of the replicas once and then kept."""

    def __init__(self, model: str, options: EngineOptions, replicas: Replicas, source_args: dict[str, Any]) -> None:
        self.model = model
        self.options = options
        self._replicas = replicas
        # Where a hub id's config files come from, for a server that does not describe its model.
        self._source_args = source_args
        self.family: ModelFamily | None = None  # known once a replica has answered
        self._served_name: str | None = None
        self._listed = False  # the served name came from the server's /v1/models (so answers must carry it)
        self.quantizes = False  # the server answers QUANTIZED_EMBED_PATH (an `rbln-retrieval serve` server does)
        self.gives_outputs = False  # and OUTPUTS_PATH: sparse and token vectors (vLLM's own server gives dense only)
        self._tokenizer: PromptTokenizer | None = None
        # The server's advertised bounds (max_payload_bytes, max_queued_tokens, ...; empty: none known).
        self.limits: dict[str, int | None] = {}

    async def described(self, deadline: Deadline | None = None) -> ModelFamily:
        """The family, asked of every replica once (retried within ``deadline``): a call never goes out without
        the served model's prompts, and replicas that describe different models are refused."""
        if self.family is None:
            descriptions = await self._descriptions(deadline)
            self.family = self._checked_family(self._server_family(descriptions))
        return self.family

    async def _descriptions(self, deadline: Deadline | None) -> dict[str, Any]:
        """{url: description (None: no description route)} of every replica that answered; RemoteError when none
        did within the retries and the deadline, ReplicaMismatchError when two disagree."""
        urls = self._replicas.urls
        answers = await asyncio.gather(
            *(self._replicas.get(DESCRIBE_PATH, deadline, url) for url in urls), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, RemoteError):
                raise answer
        found = {url: self._this_model(url, a) for url, a in zip(urls, answers) if not isinstance(a, BaseException)}
        if not found:
            failed = str(answers[0]).rstrip(".")
            raise RemoteError(
                f"No replica described {self.model} ({failed}), and a call is never sent without the model's "
                "prompts and limits; check that the server is up, or raise timeout or max_retries."
            )
        check_same_model(found)
        return found

    def _this_model(self, url: str, description: Any) -> Any:
        """This model's description: a server of several models lists theirs under ``models``."""
        if not isinstance(description, dict) or not isinstance(description.get("models"), list):
            return description
        for served in description["models"]:
            if isinstance(served, dict) and served.get("model") == self._name:
                return served
        names = ", ".join(str(d.get("model")) for d in description["models"] if isinstance(d, dict))
        raise ModelNotFoundError(f"{url} serves {names}, not {self._name}; pass one of them as the model.")

    def _server_family(self, descriptions: dict[str, Any]) -> ModelFamily | None:
        """The family the replicas describe (None: servers without the description route), their tightest limits
        kept."""
        described = [d for d in descriptions.values() if isinstance(d, dict)]
        if not described:
            return None
        self.quantizes = all(d.get("quantized_embeddings") == QUANTIZED_EMBED_PATH for d in described)
        self.gives_outputs = all(d.get("outputs") == OUTPUTS_PATH for d in described)
        limits = [d["limits"] for d in described if isinstance(d.get("limits"), dict)]
        if limits:
            tightest = {key: [v for v in (bounds.get(key) for bounds in limits) if v] for key in limits[0]}
            self.limits = {key: min(values) if values else None for key, values in tightest.items()}
            self._replicas.limit_in_flight(self.limits.get("max_concurrent_requests"))
        try:
            return ModelFamily.build(**described[0]["family"])
        except (KeyError, TypeError) as exc:
            raise RemoteError(
                f"{self._replicas.urls[0]}{DESCRIBE_PATH} answered JSON that is not a model description ({exc!r})."
            ) from exc

    async def tokenizer(self, family: ModelFamily) -> PromptTokenizer:
        """The model's tokenizer, read from the model's files on this machine (its directory, or the Hugging Face
        cache, fetched there when online): truncate="chunk" cuts windows on the client, so local and remote engines
        read the same windows."""
        if self._tokenizer is None:
            try:
                source = await asyncio.to_thread(resolve_model, self.model, weights=False, **self._source_args)
                self._tokenizer = await asyncio.to_thread(
                    PromptTokenizer, source.path, family, trust_remote_code=self.options.trust_remote_code
                )
            except (ModelNotFoundError, ModelNotSupportedError, OSError) as exc:
                raise ValueError(
                    f"truncate='chunk' cuts windows with {self.model}'s tokenizer on this machine, and it cannot be "
                    f"read here ({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})."
                ) from exc
        return self._tokenizer

    def _checked_family(self, served: ModelFamily | None) -> ModelFamily:
        wanted = self.options.family
        if served is not None:
            if wanted is not None and wanted != served.name:
                raise ValueError(
                    f"family={wanted!r} was requested, but the server serves {self.model} as {served.name!r}."
                )
            served_length = served.tokens.max_length
            if self.options.max_length and self.options.max_length != served_length:
                served = served.replace(max_length=min(served_length, self.options.max_length))
            return served
        try:
            source = resolve_model(self.model, weights=False, **self._source_args)
        except ModelNotSupportedError as exc:
            logger.info("%s Prompts come only from the family's defaults and explicit instructions.", exc)
        else:
            return detect_family(source.path, max_length=self.options.max_length, family=wanted)
        if wanted is None:
            logger.warning(
                "The server does not describe %s and family is unset: treating it as a %s. Pass family= (one of "
                "%s) if it is another.",
                self.model,
                DEFAULT_SPEC.name,
                ", ".join(SPECS_BY_NAME),
            )
        # Without the model files, prompts come only from the family's defaults and explicit instructions.
        spec = spec_named(wanted) if wanted else DEFAULT_SPEC
        return ModelFamily.build(
            wanted or family_name(spec),
            architecture="remote",
            hidden_size=0,
            max_length=self.options.max_length or 0,
            default_instruction=spec.default_instruction,
            query_prompt=spec.query_prompt,
            document_prompt=spec.document_prompt,
            matryoshka=spec.matryoshka,
        )

    def batches(
        self, items: list[Any], batch_size: int, reserve: int = 0, what: str = "", per_item: int = 0
    ) -> list[list[Any]]:
        """``items`` (texts, or images' conversations) cut into consecutive batches of at most ``batch_size`` (and the
        server's max_inputs_per_request), each request's body (with ``reserve`` bytes of other fields) under the
        server's max_payload_bytes and its tokens under max_queued_tokens, JSON escapes counted. ``per_item``: bytes
        the server's cost counts once more per item (a scoring request's query, tokenized with every document:
        rbln_retrieval.server.cost). An input over them alone is refused before any request, named ``what[i]``
        (default: "Input i")."""
        batch_size = min(batch_size, self.limits.get("max_inputs_per_request") or MAX_INPUTS_PER_REQUEST)
        payload, tokens = self.limits.get("max_payload_bytes"), self.limits.get("max_queued_tokens")
        budgets = [  # (bytes the body may hold, bytes each item costs beyond its JSON)
            (bound - BODY_RESERVE - reserve, extra)
            for bound, extra in ((payload, 0), ((tokens or 0) * TOKEN_BYTES, per_item))
            if bound
        ]
        batches: list[list[Any]] = []
        sizes = [0] * len(budgets)
        for index, item in enumerate(items):
            item_size = len(json.dumps(item)) + 2  # with ", "
            for budget, extra in budgets:
                if item_size + extra > budget:
                    raise ValueError(
                        f"{f'{what}[{index}]' if what else f'Input {index}'} is {item_size + extra} bytes as the "
                        f"server counts it, over the {budget} bytes a request to this server may hold (its "
                        "max_payload_bytes and max_queued_tokens); "
                        f"{'shorten it' if not what else 'shrink the file'} or raise the server's limits."
                    )
            full = any(size + item_size + extra > budget for size, (budget, extra) in zip(sizes, budgets))
            if not batches or len(batches[-1]) >= batch_size or full:
                batches.append([])
                sizes = [0] * len(budgets)
            batches[-1].append(item)
            sizes = [size + item_size + extra for size, (_, extra) in zip(sizes, budgets)]
        return batches

    def fit(self, text: str, truncate: object) -> str:
        """``text`` cut to the server's max_input_chars (which it refuses past) on the side ``truncate`` cuts, as a
        local engine would keep only the model's max length of it; unchanged for truncate="error" (the server then
        refuses it, as a local engine refuses a text over the max length)."""
        limit = self.limits.get("max_input_chars")
        if not limit or len(text) <= limit or truncate == "error":
            return text
        return text[-limit:] if truncate == "start" else text[:limit]

    @property
    def _name(self) -> str:
        """The name a server started with this model serves it under: a hub id without its ``@revision``."""
        return self.model if Path(self.model).is_dir() else split_reference(self.model)[0]

    async def post(self, path: str, body: dict[str, Any], deadline: Deadline | None, read: Callable[[Any], T]) -> T:
        """POST ``body`` for this model to a replica, its answer through ``read`` (rbln_retrieval.remote.answers);
        an answer for another model (vLLM serves whatever it has, whatever the request names) is refused."""
        served = await self._served_id(deadline)

        def checked(answer: Any) -> T:
            answered_for = answer.get("model") if isinstance(answer, dict) else None
            if self._listed and isinstance(answered_for, str) and answered_for != served:
                raise ReplicaMismatchError(
                    f"A replica behind {', '.join(self._replicas.urls)} answered {path} for model {answered_for!r}, "
                    f"but the replicas serve {served!r}; point base_url at replicas of one model."
                )
            return read(answer)

        answer: T = await self._replicas.post(path, {"model": served, **body}, deadline, checked)
        return answer

    async def _served_id(self, deadline: Deadline | None) -> str:
        """The name the server serves the model under (it may differ from the path this client was given)."""
        if self._served_name is None:
            try:
                listing = await self._replicas.get("/v1/models", deadline)
            except RemoteError:  # the request itself then fails, or succeeds under the given name
                return self._name
            try:
                models = listing["data"] if listing is not None else []
            except (KeyError, TypeError):
                models = []
            self._listed = len(models) == 1
            self._served_name = models[0]["id"] if self._listed else self._name
        return self._served_name


def check_same_model(descriptions: dict[str, Any]) -> None:
    """Raise ReplicaMismatchError when two replicas' descriptions differ in anything but their limits (the model,
    its family, prompts, dimensions, the fingerprint of its weights, or any version field a server publishes). A
    description without ``weights`` (a server older than the fingerprint, or one that has none) is compared on the
    rest."""
    (first, expected), *others = descriptions.items()
    for url, other in others:
        a, b = _identity(expected), _identity(other)
        if not a.get(WEIGHTS) or not b.get(WEIGHTS):
            a.pop(WEIGHTS, None), b.pop(WEIGHTS, None)
        if a == b:
            continue
        field = next((k for k in sorted({*a, *b}) if a.get(k) != b.get(k)), "description")
        if field == "family":
            inner_a, inner_b = a["family"] or {}, b["family"] or {}
            field = next(f"family.{k}" for k in sorted({*inner_a, *inner_b}) if inner_a.get(k) != inner_b.get(k))
        raise ReplicaMismatchError(
            f"The replicas serve different models: {first} has {field}={_field(a, field)!r} but {url} has "
            f"{_field(b, field)!r}; point base_url at replicas of one model and revision."
        )


def _identity(description: Any) -> dict[str, Any]:
    if not isinstance(description, dict):
        return {"description": None}  # a server without the description route
    return {k: v for k, v in description.items() if k != "limits"}


def _field(identity: dict[str, Any], field: str) -> Any:
    head, _, inner = field.partition(".")
    value = identity.get(head)
    return (value or {}).get(inner) if inner else value
