"""examples/visual_documents.py: the PDF it typesets from the Python documentation and the pages it renders, and the
example run as a user runs it (a subprocess, the README's command) with a tiny random ColPali as the page retriever
and all-MiniLM-L6-v2 as the text reranker; its printed scores are checked against the MaxSim of transformers'
ColPaliForRetrieval on the same page images and against mean-pooled MiniLM on the same page text."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference
from multimodal_builders import build_colpali, reference_colpali

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "visual_documents.py"
sys.path.insert(0, str(EXAMPLE.parent))
import visual_documents  # noqa: E402  (functions only: the example's work is behind its __main__ guard)
from docs_corpus import rag_pages  # noqa: E402

RETRIEVED = re.compile(r"^  p\.(\d+)  (-?\d+\.\d{4})  (.*)$", re.M)
ANSWER = re.compile(r"^(\d)\. (-?\d+\.\d{4})  p\.(\d+)  (.*?) \| (.*)$", re.M)
SCORE = 2e-4  # printed to 4 decimals, float32 on both sides
MAXSIM_RTOL = 1e-4  # a sum over the query's tokens, as tests/engine/test_colpali.py bounds it


@pytest.fixture(scope="module")
def documents() -> list[dict[str, str]]:
    return rag_pages(visual_documents.TOPICS)


@pytest.fixture(scope="module")
def pages(documents, tmp_path_factory) -> list[visual_documents.Page]:
    pdf = visual_documents.typeset(documents, tmp_path_factory.mktemp("pdf") / "python-docs.pdf")
    return visual_documents.render_pages(pdf)


def test_each_topic_is_typeset_under_its_outline_entry_and_read_back_from_the_text_layer(documents, pages):
    titles = [document["title"].translate(visual_documents.LATIN1) for document in documents]
    sections = [page.section for page in pages]
    assert list(dict.fromkeys(sections)) == titles  # every topic starts a page; its pages follow each other
    assert 20 <= len(pages) <= 40 and [page.number for page in pages] == list(range(1, len(pages) + 1))
    for title, document in zip(titles, documents):
        typed = "".join((document["title"] + document["text"]).translate(visual_documents.LATIN1).split())
        read = "".join("".join(page.text for page in pages if page.section == title).split())
        assert read == typed, title
    assert {page.image.mode for page in pages} == {"RGB"} and pages[0].image.size == (893, 1263)


@pytest.fixture(scope="module")
def colpali(tmp_path_factory) -> Path:
    return build_colpali(tmp_path_factory.mktemp("colpali") / "model")


@pytest.mark.slow
def test_the_example_retrieves_page_images_and_reranks_their_text_as_the_references_score_them(colpali, minilm, pages):
    command = [sys.executable, str(EXAMPLE), "--retriever", colpali, "--reranker", minilm, "--device", "cpu"]
    result = subprocess.run(
        [*map(str, command), "--dtype", "float32"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=EXAMPLE.parent.parent,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "WARNING" not in result.stderr, result.stderr
    out = result.stdout
    assert f"python-docs.pdf: {len(pages)} pages rendered at 893x1263\n" in out, out
    assert f"retrieved by page image (model): 8 of {len(pages)} pages\n" in out, out

    question = visual_documents.QUESTION
    *page_vectors, query = reference_colpali(colpali, images=[page.image for page in pages], queries=[question])
    image_scores = np.array([(query @ vectors.T).max(axis=1).sum() for vectors in page_vectors])
    retrieved = [(int(number), float(score), section) for number, score, section in RETRIEVED.findall(out)]
    assert len(retrieved) == 8 and len({number for number, _, _ in retrieved}) == 8, out
    assert [score for _, score, _ in retrieved] == sorted((score for _, score, _ in retrieved), reverse=True)
    for number, score, section in retrieved:
        assert score == pytest.approx(image_scores[number - 1], rel=MAXSIM_RTOL, abs=SCORE)
        assert section == pages[number - 1].section
    # The best 8 by the reference's scores, up to ties at the printed precision.
    left_out = [s for n, s in enumerate(image_scores, 1) if n not in {number for number, _, _ in retrieved}]
    assert min(score for _, score, _ in retrieved) >= max(left_out) * (1 - MAXSIM_RTOL) - SCORE

    answers = [
        (int(rank), float(score), int(number), section, text)
        for rank, score, number, section, text in ANSWER.findall(out)
    ]
    assert [rank for rank, *_ in answers] == [1, 2, 3], out
    assert {number for _, _, number, _, _ in answers} <= {number for number, _, _ in retrieved}
    assert [score for _, score, *_ in answers] == sorted((score for _, score, *_ in answers), reverse=True)
    texts = [pages[number - 1].text for _, _, number, _, _ in answers]
    vectors = reference.embed(str(minilm), [question, *texts], pooling="MEAN", max_length=256)
    for (_, score, number, section, text), cosine in zip(answers, vectors[1:] @ vectors[0]):
        assert score == pytest.approx(cosine, abs=SCORE)
        assert section == pages[number - 1].section and text == pages[number - 1].text[:80]


@pytest.mark.slow
def test_a_pdf_of_ones_own_that_is_missing_or_unreadable_is_refused_before_any_engine_starts(tmp_path):
    unreadable = tmp_path / "notes.pdf"
    unreadable.write_text("plain text")
    for pdf, expected in [
        (tmp_path / "missing.pdf", "missing.pdf is not a file."),
        (unreadable, "notes.pdf is not a PDF that PDFium reads (Failed to load document"),
    ]:
        command = [sys.executable, str(EXAMPLE), "--pdf", str(pdf), "--retriever", str(tmp_path / "no-model")]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert result.returncode == 2 and expected in result.stderr and "Traceback" not in result.stderr, result.stderr
