"""The prompt step: what each family's model reads for a text or a (query, document) pair, and how a relevance
score is obtained. Shared by the local engine (which tokenizes these prompts, rbln_retrieval.text.tokens) and the remote
client (which sends them as text), so both apply a model's prompts and templates identically.

Imports: models (families, family_prompts).
"""

from __future__ import annotations

from typing import Literal

from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.family_prompts import (
    EMBEDDINGGEMMA_QUERY_TEMPLATE,
    QWEN3_QUERY_TEMPLATE,
    QWEN3_RERANKER_PAIR,
    QWEN3_RERANKER_PREFIX,
    QWEN3_RERANKER_SUFFIX,
)

Kind = Literal["document", "query"]
# cosine: embed query and documents, dot product of the normalized vectors; cross-encoder: the model reads the
# (query, document) pair; qwen3-reranker: the model reads Qwen3-Reranker's chat template around the pair.
ScoreMethod = Literal["cosine", "cross-encoder", "qwen3-reranker"]


def _check_instruction(instruction: object) -> None:
    if instruction is not None and not isinstance(instruction, str):
        raise TypeError(f"instruction is {type(instruction).__name__}, expected str or None.")


def embed_prefix(family: ModelFamily, model: str, kind: str, instruction: str | None) -> str:
    """The text placed before each text of ``kind``; ``instruction`` overrides the model's own prompt (for
    Qwen3-Embedding and EmbeddingGemma queries it is the task put into the family's query template)."""
    if family.is_cross_encoder:
        raise ValueError(f"{model} is a reranker ({family.name}); it scores pairs and cannot embed.")
    if kind not in ("document", "query"):
        raise ValueError(f"kind={kind!r} is not 'document' or 'query'.")
    _check_instruction(instruction)
    if kind == "document":
        return family.document_prompt if instruction is None else instruction
    if instruction is None:
        return family.query_prompt
    if family.name == "qwen3-embedding":
        return QWEN3_QUERY_TEMPLATE.format(instruction=instruction)
    if family.name == "embeddinggemma":
        return EMBEDDINGGEMMA_QUERY_TEMPLATE.format(instruction=instruction)
    return instruction


def score_method(family: ModelFamily, model: str, instruction: str | None) -> ScoreMethod:
    """How ``family`` scores a query against documents; refuses an instruction the family cannot take."""
    _check_instruction(instruction)
    if not family.is_cross_encoder:
        return "cosine"
    if family.name == "qwen3-reranker":
        return "qwen3-reranker"
    if instruction is not None:
        raise ValueError(f"{model} is a cross-encoder and takes no instruction; leave instruction unset.")
    return "cross-encoder"


def qwen3_reranker_pairs(family: ModelFamily, query: str, documents: list[str], instruction: str | None) -> list[str]:
    """The part of Qwen3-Reranker's prompt that truncation may cut, one per document (the fixed prefix and suffix
    around it never are)."""
    task = instruction if instruction is not None else family.default_instruction
    return [QWEN3_RERANKER_PAIR.format(instruction=task, query=query, document=d) for d in documents]


def qwen3_reranker_prompts(family: ModelFamily, query: str, documents: list[str], instruction: str | None) -> list[str]:
    """Qwen3-Reranker's whole prompt per document, as text (for a server that tokenizes it)."""
    pairs = qwen3_reranker_pairs(family, query, documents, instruction)
    return [QWEN3_RERANKER_PREFIX + pair + QWEN3_RERANKER_SUFFIX for pair in pairs]
