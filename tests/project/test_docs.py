"""Every ```python block of README.md, docs/**/*.md and the integrations' READMEs runs as a test, one test per block
(ids: file:line), in this process; tests/snippets.py reads the blocks and says what their tags mean. The blocks
tagged `ray` run in tests/ray/test_docs_ray.py, on the worker of the other Ray files (tests/workers.py), so the rest of
the pages runs beside them rather than after them. Also: the tags, the README's links, the layout's modules."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from model_builders import HUB_MINILM
from servers import Server
from snippets import DOC_FILES, KINDS, ROOT, SNIPPETS, TAG, Snippet, docs_hub, params, run

__all__ = ["docs_hub"]  # a fixture this module's tests use

SERVED_URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def docs_server(docs_hub, tmp_path_factory) -> Iterator[str]:
    """`rbln-retrieval serve` of all-MiniLM-L6-v2 by its id (float32, on the CPU); its URL."""
    server = Server(HUB_MINILM, tmp_path_factory.mktemp("docs-server") / "serve.log")
    try:
        server.wait_ready()
        yield server.url
    finally:
        server.stop()


def test_the_pages_have_snippets_and_only_known_tags():
    assert len(SNIPPETS) >= 10
    assert {snippet.kind for snippet in SNIPPETS} <= KINDS | {None}
    tags = sum(bool(TAG.match(line.strip())) for path in DOC_FILES for line in path.read_text("utf-8").splitlines())
    assert tags == sum(snippet.kind is not None for snippet in SNIPPETS), "a snippet tag is not right before a block"


def test_readme_links_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = [target.split("#")[0] for target in re.findall(r"\]\(([^)\s]+)\)", text)]
    missing = [
        target
        for target in targets
        if not target.startswith(("http://", "https://")) and target and not (ROOT / target).exists()
    ]
    assert not missing


@pytest.mark.parametrize("snippet", params({None, "server", "skip"}))
def test_snippet_runs(snippet: Snippet, docs_hub, request):
    code = snippet.code
    if snippet.kind == "server":
        code = code.replace(SERVED_URL, request.getfixturevalue("docs_server"))
    run(snippet, code)


def _layout_modules() -> set[str]:
    """The modules docs/development.md's layout block names, as paths: a name counts in the folder whose line above
    it is indented less (a description's mention of a sibling counts too)."""
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    layout = text[text.index("## Layout") :]
    block = layout[layout.index("```\n") + 4 :]
    block = block[: block.index("```")]
    named, folders = set(), []  # folders: (indent, path) of the enclosing folder lines
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while folders and folders[-1][0] >= indent:
            folders.pop()
        first = line.split()[0]
        if first.endswith("/"):
            folders.append((indent, (folders[-1][1] if folders else "") + first))
            continue
        for name in re.findall(r"\b[\w]+\.py\b", line):
            named.add((folders[-1][1] if folders else "") + name)
    return named


def test_the_layout_names_every_module():
    modules = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "rbln_retrieval").rglob("*.py")
        if path.name != "__init__.py" or path.parent == ROOT / "rbln_retrieval"
    }
    assert not sorted(modules - _layout_modules()), "modules docs/development.md's layout does not name"
