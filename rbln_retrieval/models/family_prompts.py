"""Deprecated: each family's prompts and templates live in its spec (models/specs/<family>.py; the rest of the
package asks ``ModelFamily.spec``). These names stay for code that imported them from here.

Imports: models (specs).
"""

from __future__ import annotations

from rbln_retrieval.models.specs import spec_named
from rbln_retrieval.models.specs.embeddinggemma import (
    EMBEDDINGGEMMA_DOCUMENT_PROMPT,
    EMBEDDINGGEMMA_QUERY_PROMPT,
    EMBEDDINGGEMMA_QUERY_TEMPLATE,
)
from rbln_retrieval.models.specs.nomic import NOMIC_DOCUMENT_PREFIX, NOMIC_QUERY_PREFIX
from rbln_retrieval.models.specs.qwen3_embedding import QWEN3_DEFAULT_TASK, QWEN3_QUERY_TEMPLATE
from rbln_retrieval.models.specs.qwen3_reranker import (
    QWEN3_RERANKER_PAIR,
    QWEN3_RERANKER_PREFIX,
    QWEN3_RERANKER_SUFFIX,
)

__all__ = [
    "EMBEDDINGGEMMA_DOCUMENT_PROMPT",
    "EMBEDDINGGEMMA_QUERY_PROMPT",
    "EMBEDDINGGEMMA_QUERY_TEMPLATE",
    "NOMIC_DOCUMENT_PREFIX",
    "NOMIC_QUERY_PREFIX",
    "QWEN3_DEFAULT_TASK",
    "QWEN3_QUERY_TEMPLATE",
    "QWEN3_RERANKER_PAIR",
    "QWEN3_RERANKER_PREFIX",
    "QWEN3_RERANKER_SUFFIX",
    "default_document_prompt",
    "default_instruction",
    "default_query_prompt",
]


def default_query_prompt(family_name: str) -> str:
    """A family's query prompt when the model directory declares none (its spec's ``query_prompt``)."""
    return spec_named(family_name).query_prompt


def default_document_prompt(family_name: str) -> str:
    """A family's document prompt when the model directory declares none (its spec's ``document_prompt``)."""
    return spec_named(family_name).document_prompt


def default_instruction(family_name: str) -> str | None:
    """The task description a family takes when the caller gives none (its spec's ``default_instruction``)."""
    return spec_named(family_name).default_instruction
