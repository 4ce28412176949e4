"""The examples' document collection: the Python documentation's topic pages in data/python_docs.jsonl (PSF
License 2.0, see data/README.md), split into passages, and the labeled queries in data/queries.jsonl."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DOCUMENTS = DATA / "python_docs.jsonl"
QUERIES = DATA / "queries.jsonl"

# all-MiniLM-L6-v2 reads at most 256 tokens; 120 words of this text are about 160-230 tokens.
MAX_WORDS = 120


@dataclass(frozen=True)
class Passage:
    id: str  # "<document id>:<n>"
    doc_id: str
    title: str
    text: str  # title first, so a passage names its topic even out of context


@dataclass(frozen=True)
class LabeledQuery:
    query: str
    relevant: tuple[str, ...]  # ids of the documents that answer it


def _jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def load_documents(path: Path = DOCUMENTS) -> list[dict[str, str]]:
    """[{"id", "title", "text"}, ...]; paragraphs in "text" are separated by blank lines."""
    return _jsonl(path)


def load_queries(path: Path = QUERIES) -> list[LabeledQuery]:
    return [LabeledQuery(row["query"], tuple(row["relevant"])) for row in _jsonl(path)]


def split(document: dict[str, str], max_words: int = MAX_WORDS) -> list[Passage]:
    """Whole paragraphs packed greedily up to ``max_words``; a longer paragraph is cut into word windows."""
    pieces: list[str] = []
    for paragraph in document["text"].split("\n\n"):
        words = paragraph.split()
        if len(words) <= max_words:
            pieces.append(paragraph)
        else:
            pieces.extend(" ".join(words[i : i + max_words]) for i in range(0, len(words), max_words))
    chunks: list[str] = []
    size = max_words + 1  # forces a new chunk for the first piece
    for piece in pieces:
        words = len(piece.split())
        if size + words > max_words:
            chunks.append(piece)
            size = words
        else:
            chunks[-1] += "\n\n" + piece
            size += words
    return [
        Passage(f"{document['id']}:{n}", document["id"], document["title"], f"{document['title']}\n\n{chunk}")
        for n, chunk in enumerate(chunks)
    ]


def passages(max_words: int = MAX_WORDS) -> list[Passage]:
    return [p for document in load_documents() for p in split(document, max_words)]


def fingerprint(items: list[Passage]) -> str:
    """Changes whenever a passage's id or text does: a stored collection with another fingerprint is stale."""
    digest = hashlib.sha256()
    for p in items:
        digest.update(p.id.encode() + b"\0" + p.text.encode() + b"\0")
    return digest.hexdigest()[:16]


# The RAG examples index these pages (about exceptions, loops and context managers) so they start quickly;
# demo.py indexes every page.
RAG_PAGES = ("assert", "break", "context-managers", "continue", "exceptions", "for", "raise", "try", "while", "with")


def rag_pages(pages: tuple[str, ...] = RAG_PAGES) -> list[dict[str, str]]:
    return [document for document in load_documents() if document["id"] in pages]
