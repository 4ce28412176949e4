"""Options of other libraries' classes (LangChain's HuggingFaceEmbeddings, LlamaIndex's HuggingFaceEmbedding,
sentence-transformers' encode) are refused by every framework class at construction, before any model is resolved,
in one sentence naming what to use instead; docs/migrating.md names each of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from langchain_rbln import RBLNEmbeddings, RBLNReranker, RBLNSparseEmbeddings
from llama_index.embeddings.rbln import RBLNEmbedding, RBLNMultiModalEmbedding, RBLNSparseEmbedding
from llama_index.postprocessor.rbln_rerank import RBLNReranker as LlamaIndexReranker
from rbln_retrieval.frameworks.foreign import FOREIGN_OPTIONS

MIGRATING = Path(__file__).resolve().parents[2] / "docs" / "migrating.md"
# A model that does not exist: were an option accepted, construction would fail on the model instead.
MISSING = "/nonexistent/model"
CLASSES = {
    "langchain RBLNEmbeddings": (RBLNEmbeddings, "model"),
    "langchain RBLNReranker": (RBLNReranker, "model"),
    "langchain RBLNSparseEmbeddings": (RBLNSparseEmbeddings, "model"),
    "llama_index RBLNEmbedding": (RBLNEmbedding, "model_name"),
    "llama_index RBLNMultiModalEmbedding": (RBLNMultiModalEmbedding, "model_name"),
    "llama_index RBLNSparseEmbedding": (RBLNSparseEmbedding, "model_name"),
    "llama_index RBLNReranker": (LlamaIndexReranker, "model"),
}


@pytest.mark.parametrize("option", sorted(FOREIGN_OPTIONS))
@pytest.mark.parametrize("owner", sorted(CLASSES))
def test_a_foreign_option_is_refused_naming_what_to_use(owner, option):
    cls, model_field = CLASSES[owner]
    with pytest.raises(ValueError) as refused:
        cls(**{model_field: MISSING, option: {}})
    message = str(refused.value)
    assert f"{cls.__name__} has no option {option!r}: {FOREIGN_OPTIONS[option]}." in message, message


def test_the_migration_page_names_every_refused_option():
    page = MIGRATING.read_text(encoding="utf-8")
    assert [option for option in FOREIGN_OPTIONS if not re.search(rf"\b{option}\b", page)] == []
