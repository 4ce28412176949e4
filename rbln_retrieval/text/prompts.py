"""The prompt step: what each family's model reads for a text or a (query, document) pair, and how a relevance
score is obtained. Shared by the local engine (which tokenizes these prompts, rbln_retrieval.text.tokens) and the remote
client (which sends them as text), so both apply a model's prompts and templates identically.

The prompts and templates themselves are each family's spec's (rbln_retrieval.models.specs).

Imports: models (families, spec).
"""

from __future__ import annotations

from rbln_retrieval.models.families import ModelFamily
from rbln_retrieval.models.spec import PairTemplate, Scoring


def _check_instruction(instruction: object) -> None:
    if instruction is not None and not isinstance(instruction, str):
        raise TypeError(f"instruction is {type(instruction).__name__}, expected str or None.")


def embed_prefix(family: ModelFamily, model: str, kind: str, instruction: str | None) -> str:
    """The text placed before each text of ``kind``; ``instruction`` overrides the model's own prompt (for the
    queries of a family with a query template it is the task put into that template)."""
    if family.is_cross_encoder:
        raise ValueError(f"{model} is a reranker ({family.name}); it scores pairs and cannot embed.")
    if kind not in ("document", "query"):
        raise ValueError(f"kind={kind!r} is not 'document' or 'query'.")
    _check_instruction(instruction)
    if kind == "document":
        return family.prompt.document_prompt if instruction is None else instruction
    if instruction is None:
        return family.prompt.query_prompt
    template = family.spec.query_template
    return instruction if template is None else template.format(instruction=instruction)


def score_method(family: ModelFamily, model: str, instruction: str | None) -> Scoring:
    """How ``family`` scores a query against documents; refuses an instruction the family cannot take."""
    _check_instruction(instruction)
    method = family.spec.scoring
    if not method.takes_instruction and instruction is not None:
        raise ValueError(f"{model} ({family.name}) takes no instruction; leave instruction unset.")
    return method


def pair_template(family: ModelFamily) -> PairTemplate:
    """The template a pair-reading family with one reads around each (query, document) pair."""
    if family.spec.pair_template is None:
        raise ValueError(f"The {family.name} family scores without a pair template.")
    return family.spec.pair_template


def template_pairs(family: ModelFamily, query: str, documents: list[str], instruction: str | None) -> list[str]:
    """The part of a template reranker's prompt that truncation may cut, one per document (the fixed prefix and
    suffix around it never are), with the family's default task when the call names none."""
    task = instruction if instruction is not None else family.prompt.default_instruction
    return pair_template(family).pairs(query, documents, task or "")
