"""What ``embed(output=...)`` can return besides dense vectors: sparse lexical weights ({token_id: weight}) and
multi-vectors (one vector per token), finished on the host from vLLM's pooling tasks.

A model with both token-level heads runs them as pooling tasks of its own: "token_classify" gives the sparse head's
relu(linear(h)) per token without the first (bos) and last (eos) token, "token_embed" the multi-vector head's
projection per token without the first token, normalized, and "embed&token_classify" the dense vector followed by
the sparse weights from one forward. vLLM serves one task per request, so dense + sparse cost one forward and
multi-vectors one more. A late-interaction-only model's "token_embed" gives every token's projection, special
tokens included, normalized; a family whose "embed" task gives one vocabulary-sized row (``vocabulary_row``) has
that row as its sparse vector, the ids above zero being its {token_id: weight}.

Which outputs a family gives, how its token rows are trimmed and reduced, and what it needs besides, its spec says
(``family`` arguments name it; the families themselves are described in models/specs/).

Imports: models (spec, specs); numpy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

# Defined with the family specs, which say which of them each family gives.
from rbln_retrieval.models.spec import OUTPUTS as OUTPUTS
from rbln_retrieval.models.spec import Output as Output
from rbln_retrieval.models.specs import SPECS, spec_named

_MISSING_HEAD = {
    "dense": "pooled vector (it gives one vector per token)",
    "sparse": "sparse (lexical weight) head",
    "multi_vector": "multi-vector (late-interaction) head",
}


def check_outputs(output: Any, *, family: str, model: str, dimensions: int | None = None) -> tuple[Output, ...]:
    """The requested outputs as a tuple, or ValueError/TypeError in one sentence naming the model and output (or
    the ``dimensions`` given, which cut dense vectors alone)."""
    names = (output,) if isinstance(output, str) else output
    if not isinstance(names, Sequence) or isinstance(names, bytes) or not names:
        raise TypeError(f"output is {output!r}; expected one of {', '.join(OUTPUTS)} or a non-empty list of them.")
    spec = spec_named(family)
    for name in names:
        if name not in OUTPUTS:
            raise ValueError(f"output={name!r} is not one of {', '.join(map(repr, OUTPUTS))}.")
        if name not in spec.outputs and spec.refuse_output:
            raise ValueError(spec.refuse_output.format(model=model, output=name, missing=_MISSING_HEAD[name]))
        if name not in spec.outputs:
            raise ValueError(
                f"{model} has no {_MISSING_HEAD[name]} (family {family}), so it cannot give output={name!r}; "
                f"models of these families can: {', '.join(s.name for s in SPECS if name in s.outputs)}."
            )
    if len(set(names)) != len(names):
        raise ValueError(f"output={list(names)!r} names an output twice.")
    _refuse_dimensions(output, dimensions)
    return tuple(names)


def _refuse_dimensions(output: Any, dimensions: int | None) -> None:
    if dimensions is not None:
        raise ValueError(f"dimensions applies to dense vectors only; leave it unset with output={output!r}.")


def npu_note(family: str, model: str) -> str | None:
    """What the bundled runner on the NPU does with this family's token-level outputs, for the engine's start."""
    spec = spec_named(family)
    outputs = spec.outputs
    if outputs == ("dense",):
        return None
    if spec.npu_note:
        return f"{model}: {spec.npu_note}"
    if "dense" not in outputs:
        return f"{model}: multi-vector outputs are pooled by vLLM's pooler on the host from the graph's hidden states."
    return (
        f"{model}: dense vectors are pooled inside the NPU graph; sparse and multi-vector outputs are pooled by "
        "vLLM's pooler on the host from the graph's hidden states."
    )


def check_remote_outputs(output: Any, *, family: str, model: str, dimensions: int | None = None) -> tuple[Output, ...]:
    """``check_outputs`` for a RemoteEngine whose server is vLLM's own: vLLM 0.30's server answers one pooling task
    per model (its /pooling route refuses "embed&token_classify" and a server started for "embed" serves no token
    tasks), so a served model gives dense vectors only; `rbln-retrieval serve` gives every output."""
    outputs = check_outputs(output, family=family, model=model)
    if token_level := [name for name in outputs if name != "dense"]:
        raise ValueError(
            f"output={token_level[0]!r} of {model} is not served by this server (vLLM's own server gives one pooling "
            "task per model, dense vectors here); serve the model with `rbln-retrieval serve`, which gives every "
            "output, or compute it with a local PoolingEngine."
        )
    _refuse_dimensions(output, dimensions)
    return outputs


PoolingTask = Literal["embed", "token_classify", "token_embed", "embed&token_classify"]


def pooling_tasks(outputs: tuple[Output, ...], family: str = "") -> list[PoolingTask]:
    """vLLM pooling tasks that compute ``outputs``, one forward each."""
    if spec_named(family).vocabulary_row:
        return ["embed"]  # its one output is its pooled (vocabulary-sized) row
    tasks: list[PoolingTask] = []
    if "dense" in outputs and "sparse" in outputs:
        tasks.append("embed&token_classify")
    elif "dense" in outputs:
        tasks.append("embed")
    elif "sparse" in outputs:
        tasks.append("token_classify")
    if "multi_vector" in outputs:
        tasks.append("token_embed")
    return tasks


@dataclass(frozen=True)
class SpecialTokens:
    """The ids vLLM trims from token-level outputs (bos, eos from the model config) and those a sparse head's lexical
    weights leave out (cls, eos, pad, unk, as FlagEmbedding's ``_process_token_weights``)."""

    bos: int | None
    eos: int | None
    unused: frozenset[int]

    @classmethod
    def of(cls, tokenizer: Any, model_dir: str) -> SpecialTokens:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        named = tokenizer.special_tokens_map
        unused = {
            tokenizer.convert_tokens_to_ids(named[name])
            for name in ("cls_token", "eos_token", "pad_token", "unk_token")
            if name in named
        }
        return cls(config.get("bos_token_id"), config.get("eos_token_id"), frozenset(unused))


def lexical_weights(ids: list[int], weights: np.ndarray, special: SpecialTokens) -> dict[int, float]:
    """{token_id: weight} for one text: special tokens and zero weights left out, the largest weight kept for a
    token that occurs more than once. ``weights`` holds one entry per token vLLM kept (see module docstring)."""
    start = 1 if ids and ids[0] == special.bos else 0
    end = len(ids) - 1 if len(ids) > start and ids[-1] == special.eos else len(ids)
    if len(weights) != end - start:
        raise RuntimeError(f"vLLM returned {len(weights)} token weights for a prompt of {len(ids)} tokens.")
    result: dict[int, float] = {}
    for token, weight in zip(ids[start:end], np.maximum(weights, 0.0).tolist()):
        if token not in special.unused and weight > 0 and weight > result.get(token, 0.0):
            result[token] = weight
    return result


def vocabulary_weights(row: np.ndarray) -> dict[int, float]:
    """{token_id: weight} of a vocabulary-sized row, ids in increasing order, zeros left out."""
    ids = np.flatnonzero(row > 0)
    return dict(zip(ids.tolist(), row[ids].tolist()))


def sparse_dot(a: dict[int, float], b: dict[int, float]) -> float:
    """Relevance of two sparse vectors: their dot product, as sentence-transformers' SparseEncoder scores."""
    if len(b) < len(a):
        a, b = b, a
    return float(sum(weight * b[token] for token, weight in a.items() if token in b))


def maxsim(query: np.ndarray, document: np.ndarray, *, family: str) -> float:
    """Late-interaction relevance: each query vector's best dot product with any document vector, summed over the
    query vectors (as vLLM's ``compute_maxsim_score``), or averaged: the family spec's ``maxsim_reduction``."""
    if len(query) == 0 or len(document) == 0:
        return 0.0
    best = (query @ document.T).max(axis=1)
    return float(best.mean() if spec_named(family).maxsim_reduction == "mean" else best.sum())


def normalized(rows: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32), as torch.nn.functional.normalize (eps 1e-12)."""
    norms = np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), 1e-12)
    unit: np.ndarray = (rows / norms).astype(np.float32, copy=False)
    return unit


def assemble(
    outputs: tuple[Output, ...],
    raw: dict[str, list[np.ndarray]],
    token_ids: list[list[int]],
    *,
    hidden_size: int,
    normalize: bool,
    special: SpecialTokens,
    family: str = "",
) -> dict[str, Any]:
    """Per output, the results for every text from the raw rows of each pooling task (requested without vLLM's
    activation where one task carries two outputs; see ``activation``)."""
    result: dict[str, Any] = {}
    if spec_named(family).vocabulary_row:
        result["sparse"] = [vocabulary_weights(row) for row in raw["embed"]]
    elif "embed&token_classify" in raw:
        rows = raw["embed&token_classify"]
        dense = np.stack([row[:hidden_size] for row in rows]) if rows else np.zeros((0, hidden_size), np.float32)
        result["dense"] = normalized(dense) if normalize else dense.astype(np.float32, copy=False)
        result["sparse"] = [lexical_weights(ids, row[hidden_size:], special) for ids, row in zip(token_ids, rows)]
    elif "embed" in raw:
        rows = raw["embed"]
        result["dense"] = np.stack(rows).astype(np.float32) if rows else np.zeros((0, hidden_size), np.float32)
    elif "token_classify" in raw:
        result["sparse"] = [lexical_weights(ids, row, special) for ids, row in zip(token_ids, raw["token_classify"])]
    if "token_embed" in raw:
        result["multi_vector"] = [
            row.reshape(-1, hidden_size).astype(np.float32, copy=False) for row in raw["token_embed"]
        ]
    return {name: result[name] for name in outputs}


def activation(task: str, normalize: bool) -> bool:
    """vLLM's ``use_activation`` per task. The combined task's activation would tie the dense vector's
    normalization to the sparse relu, so it runs without and ``assemble`` applies both."""
    if task == "embed&token_classify":
        return False
    return True if task == "token_classify" else normalize
