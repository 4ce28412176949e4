"""Qwen3-Embedding: a Qwen3 causal LM with a sentence-transformers last-token pooling module; queries carry an
instruction in its template, documents nothing.

Imports: models (spec).
"""

from __future__ import annotations

from typing import Any

from rbln_retrieval.models.spec import Checkpoint, FamilySpec

QWEN3_ARCHS = frozenset({"Qwen3ForCausalLM", "Qwen3Model"})
QWEN3_DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_QUERY_TEMPLATE = "Instruct: {instruction}\nQuery:"


def _task(query_prompt: str) -> str | None:
    """Recover the task description from a Qwen3 query prompt such as 'Instruct: <task>\\nQuery:'."""
    if query_prompt.startswith("Instruct: ") and query_prompt.endswith("\nQuery:"):
        return query_prompt[len("Instruct: ") : -len("\nQuery:")]
    return None


def _preset(ckpt: Checkpoint) -> dict[str, Any]:
    common = ckpt.common()
    query_prompt = ckpt.query_prompt(SPEC.query_prompt)
    return {
        **common,
        "pooling": "LAST",
        "normalize": True,
        "query_prompt": query_prompt,
        "document_prompt": ckpt.document_prompt(),
        "default_instruction": _task(query_prompt) or QWEN3_DEFAULT_TASK,
        "matryoshka": True,
        "kv_bytes_per_token": ckpt.kv_bytes_per_token(),
        # The Qwen3 configs lack vLLM's matryoshka flag (QwenLM/Qwen3-Embedding#85).
        "hf_overrides": {**common["hf_overrides"], "is_matryoshka": True},
    }


SPEC = FamilySpec(
    name="qwen3-embedding",
    architectures=QWEN3_ARCHS,
    # A Qwen3 checkpoint with a sentence-transformers pooling module; without one it is the original reranker.
    detect=lambda ckpt: ckpt.arch in QWEN3_ARCHS and ckpt.pooling is not None,
    preset=_preset,
    query_prompt=QWEN3_QUERY_TEMPLATE.format(instruction=QWEN3_DEFAULT_TASK),
    query_template=QWEN3_QUERY_TEMPLATE,
    default_instruction=QWEN3_DEFAULT_TASK,
    matryoshka=True,
)
