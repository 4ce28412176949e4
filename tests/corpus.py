"""Real English text for tests: the Python documentation's topic pages (pydoc_data, PSF license), split into
paragraphs of mixed length."""

from __future__ import annotations

import pydoc_data.topics


def passages(min_words: int = 1) -> list[str]:
    out = []
    for topic in sorted(pydoc_data.topics.topics):
        for paragraph in pydoc_data.topics.topics[topic].split("\n\n"):
            text = " ".join(paragraph.split())
            if len(text.split()) >= min_words and not set(text) <= set("*=-~ "):
                out.append(text)
    return out


def mixed_length(n: int) -> list[str]:
    """n texts from one word to thousands of words (several exceed any 512-token limit)."""
    paras = passages(min_words=3)
    texts = [p for p in paras[: n - 20]]
    joined = " ".join(paras)
    words = joined.split()
    texts += [
        " ".join(words[i * 97 : i * 97 + length])
        for i, length in enumerate([1, 2, 3, 5, 8, 13, 300, 600, 1200, 2500] * 2)
    ]
    return texts[:n]
