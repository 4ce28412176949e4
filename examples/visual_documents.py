"""Visual-document RAG: PDF pages retrieved as images, then reranked by their text.

    python examples/visual_documents.py ["question"] [--retriever ID|DIR] [--reranker ID|DIR] [--pdf FILE]
        [--top-k K] [--top-n N] [--device auto|rbln|cpu] [--dtype auto|float32|bfloat16]

Without --pdf, the Python documentation's pages on statements, exceptions and definitions are typeset into a PDF
of about thirty pages (fpdf2; each topic starts a page and has an outline entry). Every page is rendered to an image
(pypdfium2). The retriever scores the question against the page images (`rerank_images`: MaxSim over ColPali's
patch vectors, cosine for CLIP and SigLIP) and keeps the best K pages; the reranker reads those pages' text layer
(`rerank`) and the best N are the answer. The defaults are Hugging Face ids (vidore/colpali-v1.3-hf,
BAAI/bge-reranker-v2-m3); a model directory works as well. Needs fpdf2 and pypdfium2 (requirements/dev.txt).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTION = "How do I run cleanup code whether or not an exception occurs?"
RETRIEVER = "vidore/colpali-v1.3-hf"
RERANKER = "BAAI/bge-reranker-v2-m3"
TOPICS = (
    "assert", "break", "continue", "del", "for", "global", "if", "import", "pass", "raise", "return", "try", "while",
    "with", "yield", "class", "function", "lambda", "context-managers", "exceptions",
)  # fmt: skip
# 108 dpi: legible to a person looking at the images; the model's processor resizes them to its own input size.
RENDER_SCALE = 1.5
# PDF core fonts are Latin-1; the corpus's typographic punctuation is written in ASCII.
LATIN1 = str.maketrans(
    {"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "--", "\u2026": "..."}
)

# PDFium reads a hyphen that ends a line as a possible soft hyphen: it joins the two lines and returns U+FFFE.
SOFT_HYPHEN = "\ufffe"


@dataclass(frozen=True)
class Page:
    number: int  # 1-based, as a PDF viewer counts
    section: str  # the outline entry the page falls under ("" in a PDF without an outline)
    text: str  # the page's text layer, whitespace collapsed
    image: Any  # PIL image


def typeset(documents: list[dict[str, str]], path: Path) -> Path:
    """A PDF of ``documents`` ({"title", "text"}), each from a new page under its own outline entry; the text in a
    fixed-width font, as `help()` shows it."""
    from fpdf import FPDF

    pdf = FPDF(format="A4")
    pdf.set_margins(20, 20, 20)
    for document in documents:
        title = document["title"].translate(LATIN1)
        pdf.add_page()
        pdf.start_section(title)
        pdf.set_font("Helvetica", style="B", size=16)
        pdf.multi_cell(0, 9, title)
        pdf.ln(3)
        pdf.set_font("Courier", size=9)
        pdf.multi_cell(0, 4.2, document["text"].translate(LATIN1))
    pdf.output(str(path))
    return path


def render_pages(path: Path, scale: float = RENDER_SCALE) -> list[Page]:
    """Each page of the PDF at ``path`` as an RGB image with its text layer and outline section."""
    import pypdfium2

    pdf = pypdfium2.PdfDocument(str(path))
    try:
        starts = sorted(
            (item.get_dest().get_index(), item.get_title())
            for item in pdf.get_toc()
            if item.level == 0 and item.get_dest() is not None
        )
        pages = []
        for index, page in enumerate(pdf):
            section = next((title for start, title in reversed(starts) if start <= index), "")
            text = " ".join(page.get_textpage().get_text_range().replace(SOFT_HYPHEN, "-").split())
            image = page.render(scale=scale).to_pil().convert("RGB")
            pages.append(Page(index + 1, section, text, image))
        return pages
    finally:
        pdf.close()


def command_line() -> Any:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument(
        "--retriever", default=RETRIEVER, help=f"image retriever: ColPali, CLIP or SigLIP ({RETRIEVER})"
    )
    parser.add_argument("--reranker", default=RERANKER, help=f"text reranker or embedding model ({RERANKER})")
    parser.add_argument("--pdf", type=Path, help="a PDF of your own instead of the Python documentation")
    parser.add_argument("--top-k", type=int, default=8, help="pages retrieved by their image")
    parser.add_argument("--top-n", type=int, default=3, help="pages kept by the reranker")
    parser.add_argument("--device", choices=("auto", "rbln", "cpu"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto")
    return parser


def main() -> None:
    import tempfile

    import pypdfium2
    from docs_corpus import rag_pages

    from rbln_retrieval import PoolingEngine, RBLNRetrievalError

    parser = command_line()
    args = parser.parse_args()
    if args.pdf is not None and not args.pdf.is_file():
        parser.exit(2, f"{parser.prog}: {args.pdf} is not a file.\n")
    with tempfile.TemporaryDirectory() as scratch:
        pdf = args.pdf or typeset(rag_pages(TOPICS), Path(scratch) / "python-docs.pdf")
        try:
            pages = render_pages(pdf)
        except pypdfium2.PdfiumError as exc:  # PDFium also refuses a PDF without pages
            parser.exit(2, f"{parser.prog}: {pdf} is not a PDF that PDFium reads ({exc})\n")
    width, height = pages[0].image.size
    print(f"{pdf.name}: {len(pages)} pages rendered at {width}x{height}")
    print(f"question: {args.question}")
    options = {"device": args.device, "dtype": args.dtype}
    try:
        # One engine at a time: a ColPali checkpoint alone is about 3B parameters.
        with PoolingEngine(args.retriever, **options) as retriever:
            hits = retriever.rerank_images(args.question, [page.image for page in pages], top_n=args.top_k)
        candidates = [pages[index] for index, _ in hits]
        print(f"retrieved by page image ({Path(args.retriever).name}): {len(hits)} of {len(pages)} pages")
        for page, (_, score) in zip(candidates, hits):
            print(f"  p.{page.number}  {score:.4f}  {page.section}")
        with PoolingEngine(args.reranker, **options) as reranker:
            best = reranker.rerank(args.question, [page.text for page in candidates], top_n=args.top_n)
    except (RBLNRetrievalError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    print(f"answer pages, reranked by their text ({Path(args.reranker).name}):")
    for rank, (index, score) in enumerate(best, 1):
        page = candidates[index]
        print(f"{rank}. {score:.4f}  p.{page.number}  {page.section} | {page.text[:80]}")


if __name__ == "__main__":  # vLLM's engine process imports this module again
    from rbln_retrieval.quiet import quiet_startup

    quiet_startup()
    main()
