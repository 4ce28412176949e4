"""Each family's prompts and templates as its model card gives them, and the defaults a family takes when the model
directory declares none: data read by the family table (families.py) and applied by the prompt step
(rbln_retrieval.text.prompts).

Imports nothing.
"""

from __future__ import annotations

QWEN3_DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"
QWEN3_QUERY_TEMPLATE = "Instruct: {instruction}\nQuery:"
# EmbeddingGemma's retrieval prompts (its model card and config_sentence_transformers.json); an instruction becomes
# the query's task.
EMBEDDINGGEMMA_QUERY_TEMPLATE = "task: {instruction} | query: "
EMBEDDINGGEMMA_QUERY_PROMPT = EMBEDDINGGEMMA_QUERY_TEMPLATE.format(instruction="search result")
EMBEDDINGGEMMA_DOCUMENT_PROMPT = "title: none | text: "
QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_RERANKER_PAIR = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
# nomic-embed-text's task prefixes for retrieval (its model card: every text must carry one).
NOMIC_QUERY_PREFIX = "search_query: "
NOMIC_DOCUMENT_PREFIX = "search_document: "


def default_query_prompt(family_name: str) -> str:
    """A family's query prompt when the model directory declares none."""
    if family_name == "nomic":
        return NOMIC_QUERY_PREFIX
    if family_name == "embeddinggemma":
        return EMBEDDINGGEMMA_QUERY_PROMPT
    return QWEN3_QUERY_TEMPLATE.format(instruction=QWEN3_DEFAULT_TASK) if family_name == "qwen3-embedding" else ""


def default_document_prompt(family_name: str) -> str:
    """A family's document prompt when the model directory declares none."""
    return {"nomic": NOMIC_DOCUMENT_PREFIX, "embeddinggemma": EMBEDDINGGEMMA_DOCUMENT_PROMPT}.get(family_name, "")


def default_instruction(family_name: str) -> str | None:
    """The task description Qwen3 models take when the caller gives none; other families take none."""
    return QWEN3_DEFAULT_TASK if family_name in ("qwen3-embedding", "qwen3-reranker") else None
