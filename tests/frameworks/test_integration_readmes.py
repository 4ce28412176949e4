"""The integration READMEs' option tables say what the classes do: every option a table names is a field of the
class, and the default it states is the field's default (their snippets run in tests/project/test_docs.py)."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from langchain_rbln import RBLNEmbeddings, RBLNReranker, RBLNSparseEmbeddings
from llama_index.embeddings.rbln import RBLNEmbedding
from rbln_retrieval.models import source as source_module

ROOT = Path(__file__).resolve().parents[2]
# README -> the classes its option table describes (every row holds for each of them, unless the cell names one).
TABLES: dict[str, tuple[type[BaseModel], ...]] = {
    "integrations/langchain/README.md": (RBLNEmbeddings, RBLNReranker, RBLNSparseEmbeddings),
    "integrations/llama_index/embeddings/README.md": (RBLNEmbedding,),
}
ROW = re.compile(r"^\| (?P<names>`[^|]+`) \| (?P<default>[^|]+) \|")


def rows(readme: str) -> list[tuple[list[str], str]]:
    """(option names, default cell) of each option row of the README's tables whose header is `| ... | default |`."""
    found, in_table = [], False
    for line in (ROOT / readme).read_text(encoding="utf-8").splitlines():
        if line.startswith("|") and "| default |" in line:
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and (match := ROW.match(line)):
            found.append((re.findall(r"`(\w+)`", match["names"]), match["default"].strip()))
    return found


def field_default(cls: type[BaseModel], name: str) -> object:
    if name in ("model", "model_name") and "model" not in cls.model_fields:
        # LlamaIndex's classes take the model as model_name= or model= and fill in the default in __init__.
        source = inspect.getsource(cls.__init__)
        return next(value for key, value in vars(source_module).items() if key.startswith("DEFAULT_") and key in source)
    fields = cls.model_fields
    key = name if name in fields else next(k for k, f in fields.items() if f.alias == name)
    field = fields[key]
    return field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]


@pytest.mark.parametrize("readme", sorted(TABLES))
def test_every_option_in_the_table_is_a_field_with_that_default(readme):
    table = rows(readme)
    assert len(table) >= 15, f"{readme}: the option table was not found"
    wrong = []
    for names, default in table:
        for cls in TABLES[readme]:
            for name in names:
                if name == "model" and "model" not in cls.model_fields:
                    continue  # LlamaIndex's classes: an __init__ alias of model_name (checked under that name)
                if (
                    name != "model_name"
                    and name not in cls.model_fields
                    and all(f.alias != name for f in cls.model_fields.values())
                ):
                    wrong.append(f"{cls.__name__} has no field {name}")
                    continue
                actual = field_default(cls, name)
                if f"`{cls.__name__}`" in default:  # a default per class: `Class`: `value`; ...
                    stated = re.search(rf"`{cls.__name__}`: `([^`]+)`", default)
                    expected = ast.literal_eval(stated[1]) if stated else None
                elif re.fullmatch(r"`[^`]+`( \(.*\))?", default):  # `value`, maybe with a note
                    try:
                        expected = ast.literal_eval(default.split("`")[1])
                    except (ValueError, SyntaxError):
                        continue  # a name such as `$RBLN_API_KEY`: said in words, not a literal
                elif default in ("model's limit", "required"):
                    expected = None if default == "model's limit" else ...
                else:
                    expected = ast.literal_eval(default)
                if hasattr(actual, "get_secret_value") or name == "api_key":
                    continue  # read from the environment (the table says which variable)
                if expected != actual:
                    wrong.append(f"{cls.__name__}.{name}: README says {default}, the default is {actual!r}")
    assert wrong == []
