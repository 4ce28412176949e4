"""Rebuild python_docs.jsonl from the running interpreter's `pydoc_data.topics` (the text `help("topic")` shows).

Usage: python examples/data/make_corpus.py > examples/data/python_docs.jsonl

Several topic pages are umbrellas that repeat smaller ones word for word ("compound" holds "if", "for", "try",
...; "specialnames" holds "customization", "attribute-access", ...). Each paragraph is kept once, in the
shortest page that contains it, so every passage belongs to exactly one document and the labeled queries in
queries.jsonl have one right answer. Pages left empty by that ("else" repeats "if") are dropped.
"""

from __future__ import annotations

import json
import pydoc_data.topics
import sys


def _paragraphs(page: str) -> list[str]:
    out = []
    for block in page.split("\n\n"):
        lines = [line.rstrip() for line in block.strip("\n").splitlines()]
        # Title underlines ("*****", "=====") carry no text.
        lines = [line for line in lines if line.strip() and not set(line.strip()) <= set("*=-~^")]
        if lines:
            out.append("\n".join(lines))
    return out


def documents() -> list[dict[str, str]]:
    topics = pydoc_data.topics.topics
    seen: set[str] = set()
    kept: dict[str, tuple[str, list[str]]] = {}
    # Shortest first; of identical pages ("if" and "else") the one whose title names it wins.
    for name in sorted(topics, key=lambda n: (len(topics[n]), f'"{n}"' not in topics[n].split("\n", 1)[0], n)):
        title, *body = _paragraphs(topics[name])
        fresh = []
        for paragraph in body:
            key = " ".join(paragraph.split())
            if key not in seen:
                seen.add(key)
                fresh.append(paragraph)
        if fresh:
            kept[name] = (title, fresh)
    return [{"id": name, "title": kept[name][0], "text": "\n\n".join(kept[name][1])} for name in sorted(kept)]


if __name__ == "__main__":
    for document in documents():
        sys.stdout.write(json.dumps(document, ensure_ascii=False) + "\n")
