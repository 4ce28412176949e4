"""`make demo`: retrieval over the Python documentation with rbln-retrieval, checked against sentence-transformers.

Ingests the topic pages of the Python documentation (examples/data, PSF License 2.0) into a persistent Chroma
collection, answers a few questions (retrieve, then rerank), and evaluates recall@1/@5 and MRR on the labeled
queries in examples/data/queries.jsonl next to the same pipeline run with sentence-transformers.

    python examples/demo.py [--data-dir .demo-data] [--fresh] [--dtype auto|float32|bfloat16]

The verdict is what the engine's compute dtype can honestly claim against the float32 reference
(rbln_retrieval.results.precision): every passage and query vector within the dtype's cosine bound, every rerank score
within its score bound, rankings equal up to near-ties that bound cannot resolve, and recall/MRR equal up to the
queries such a tie decides. It exits 1 only when one of these fails.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from docs_corpus import Passage, fingerprint, load_documents, load_queries, passages
from example_args import embedded_minilm

from rbln_retrieval.quiet import quiet_startup

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = 10  # passages retrieved per question and handed to the reranker
QUESTIONS = [
    "How do I handle an exception and still close a file?",
    "How can I make my own objects comparable with < and ==?",
    "What is the difference between a list and a tuple?",
]


class Store:
    """A persistent Chroma collection of the corpus; reusable when it holds exactly these passages."""

    def __init__(self, client, collection, where: Path, fingerprint: str, size: int):
        self.client, self.collection, self.where = client, collection, where
        self.fingerprint, self.size = fingerprint, size
        self.name = collection.name

    @classmethod
    def open(cls, data_dir: Path, name: str, corpus: list[Passage]) -> Store:
        import chromadb

        where = data_dir / "chroma"
        client = chromadb.PersistentClient(path=str(where), settings=chromadb.Settings(anonymized_telemetry=False))
        # Vectors are always supplied by us: no embedding function, so Chroma never loads (or downloads) its own.
        # ef_search above the corpus size: the search visits the whole graph, so the top 10 is the exact one. Chroma
        # builds its HNSW graph on several threads, and two stores of equal vectors otherwise return different
        # candidates now and then, which the demo's verdict would read as the two pipelines disagreeing.
        hnsw = {"space": "cosine", "ef_search": max(100, 2 * len(corpus))}
        options = {"embedding_function": None, "configuration": {"hnsw": hnsw}}
        collection = client.get_or_create_collection(name, **options)
        store = cls(client, collection, where, fingerprint(corpus), len(corpus))
        if not store.ready and store.count:
            client.delete_collection(name)  # built from another corpus or interrupted: start over
            store.collection = client.create_collection(name, **options)
        return store

    @property
    def meta(self) -> dict:
        return self.collection.metadata or {}

    @property
    def count(self) -> int:
        return self.collection.count()

    @property
    def ready(self) -> bool:
        return self.meta.get("fingerprint") == self.fingerprint and self.count == self.size

    def fill(self, corpus: list[Passage], vectors: np.ndarray, **stats: float) -> None:
        step = self.client.get_max_batch_size()
        for i in range(0, len(corpus), step):
            part = corpus[i : i + step]
            self.collection.add(
                ids=[p.id for p in part],
                embeddings=vectors[i : i + step],
                documents=[p.text for p in part],
                metadatas=[{"doc_id": p.doc_id} for p in part],
            )
        # The fingerprint goes in last: a run interrupted while adding leaves a collection that is not ready.
        self.collection.modify(metadata={**self.meta, "fingerprint": self.fingerprint, **stats})

    def vectors(self, ids: list[str]) -> np.ndarray:
        """The stored vectors of ``ids``, in that order."""
        found = self.collection.get(ids=ids, include=["embeddings"])
        by_id = dict(zip(found["ids"], found["embeddings"]))
        return np.array([by_id[i] for i in ids], dtype=np.float32)

    def query(self, vector: np.ndarray, k: int) -> list[tuple[str, str]]:
        """(passage id, text) of the k nearest passages by cosine similarity, nearest first."""
        found = self.collection.query(query_embeddings=[vector], n_results=k, include=["documents"])
        return list(zip(found["ids"][0], found["documents"][0]))


@dataclass
class Pipeline:
    """Chroma retrieval + reranking with one embedding implementation (ours, or the sentence-transformers one)."""

    name: str
    store: Store
    embed_query: Callable[[str], np.ndarray]
    rerank: Callable[[str, list[str]], list[tuple[int, float]]]

    def search(self, query: str, k: int = CANDIDATES) -> tuple[list[tuple[str, float]], float, float]:
        """((passage id, rerank score) best first, retrieval seconds, rerank seconds)."""
        start = time.perf_counter()
        hits = self.store.query(self.embed_query(query), k)
        retrieved = time.perf_counter()
        ranked = self.rerank(query, [text for _, text in hits])
        return [(hits[i][0], score) for i, score in ranked], retrieved - start, time.perf_counter() - retrieved


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=ROOT / ".demo-data", help="where Chroma keeps its files")
    parser.add_argument("--fresh", action="store_true", help="delete the stored collections and embed again")
    parser.add_argument(
        "--dtype", choices=("auto", "float32", "bfloat16"), default="auto", help="the engine's compute dtype"
    )
    args = parser.parse_args(argv)
    quiet_startup()
    if args.fresh:
        shutil.rmtree(args.data_dir / "chroma", ignore_errors=True)

    from rbln_retrieval import PoolingEngine
    from rbln_retrieval.local.device import explain_auto

    model = embedded_minilm()
    corpus = passages()
    device, why = explain_auto()
    print("rbln-retrieval demo: questions over the Python documentation (PSF License 2.0, examples/data)")
    _row("corpus", f"{len(load_documents())} topic pages -> {len(corpus)} passages of at most 120 words")
    _row("model", f"all-MiniLM-L6-v2 on {device}")
    _row("", f"device='auto' chose {device}: {why}")

    start = time.perf_counter()
    # vLLM's per-shard loading bar is noise for a one-file model.
    engine = PoolingEngine(model, device="auto", dtype=args.dtype)
    try:
        return _run(engine, time.perf_counter() - start, args.data_dir, model, corpus)
    finally:
        engine.close()


def _run(engine, start_s: float, data_dir: Path, model: str, corpus: list[Passage]) -> int:
    _row(
        "engine",
        f"started in {start_s:.1f} s (runner={engine.options.runner}, {engine.device}, {engine.dtype}, "
        f"{engine.dimension} dims)",
    )
    ours = Pipeline(
        "rbln-retrieval",
        # one collection per dtype: a bfloat16 run never reuses float32 vectors, nor the other way round
        Store.open(data_dir, f"python-docs-rbln-{engine.dtype}", corpus),
        lambda q: engine.embed([q], kind="query")[0],
        lambda q, texts: engine.rerank(q, texts),
    )
    _ingest(
        "ingest",
        ours.store,
        corpus,
        lambda texts: engine.embed(texts, show_progress=True),
        # the tokens the engine computes: its own tokenizer, prompt and truncation
        lambda texts: sum(
            len(t.ids) for t in engine.tokenizer.encode_texts(texts, engine.family.prompt.document_prompt)
        ),
    )
    _row("rerank", "all-MiniLM-L6-v2 cosine through engine.rerank: no cross-encoder weights are available")
    _row("", "offline, so the bi-encoder rescores its own candidates and mostly keeps their order")

    for question in QUESTIONS:
        _answer(ours, question, corpus)

    reference = _sentence_transformers_pipeline(model, data_dir, corpus)
    return 0 if _evaluate(ours, reference, engine.dtype, corpus) else 1


def _row(label: str, text: str) -> None:
    print(f"{label:<10} {text}")


def _ingest(
    label: str,
    store: Store,
    corpus: list[Passage],
    embed: Callable[[list[str]], np.ndarray],
    count_tokens: Callable[[list[str]], int] | None = None,
) -> None:
    if store.ready:
        _row(label, f"reusing Chroma collection {store.name!r}: {store.count} passages in {_short(store.where)}")
        _row("", f"(embedded by the first run at {store.meta['passages_per_s']:.1f} passages/s; --fresh embeds again)")
        return
    texts = [p.text for p in corpus]
    start = time.perf_counter()
    vectors = embed(texts)
    seconds = time.perf_counter() - start
    store.fill(corpus, vectors, passages_per_s=len(texts) / seconds)
    line = f"{len(texts)} passages in {seconds:.1f} s: {len(texts) / seconds:.1f} passages/s"
    if count_tokens is not None:
        line += f", {count_tokens(texts) / seconds:,.0f} tokens/s"
    _row(label, line)
    _row("", f"-> Chroma collection {store.name!r} in {_short(store.where)}")


def _short(path: Path) -> str:
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _answer(pipeline: Pipeline, question: str, corpus: list[Passage], show: int = 3) -> None:
    by_id = {p.id: p for p in corpus}
    ranked, retrieve_s, rerank_s = pipeline.search(question)
    print(f"\nQ: {question}   ({retrieve_s * 1000:.0f} ms retrieve + {rerank_s * 1000:.0f} ms rerank)")
    for place, (pid, score) in enumerate(ranked[:show], 1):
        body = " ".join(by_id[pid].text.split("\n\n", 1)[1].split())
        print(f"  {place}. {score:.3f}  {pid:<22} {body[:84]}{'...' if len(body) > 84 else ''}")


def _sentence_transformers_pipeline(model: str, data_dir: Path, corpus: list[Passage]) -> Pipeline:
    """The same pipeline with sentence-transformers computing every vector (queries, passages, rerank)."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from tqdm.auto import tqdm

    transformers.logging.disable_progress_bar()
    st = SentenceTransformer(str(model), device="cpu")

    def encode(texts: list[str], bar: bool = False) -> np.ndarray:
        rows = []
        with tqdm(total=len(texts), disable=not bar, desc="Reference", unit="text") as progress:
            for i in range(0, len(texts), 32):
                rows.append(st.encode(texts[i : i + 32], normalize_embeddings=True, show_progress_bar=False))
                progress.update(len(rows[-1]))
        return np.concatenate(rows)

    def rerank(query: str, texts: list[str]) -> list[tuple[int, float]]:
        scores = encode(texts) @ encode([query])[0]
        return sorted(((i, float(s)) for i, s in enumerate(scores)), key=lambda pair: (-pair[1], pair[0]))

    print()
    _row("reference", f"sentence-transformers {_version('sentence-transformers')}: the same pipeline with its vectors")
    store = Store.open(data_dir, "python-docs-sentence-transformers", corpus)
    _ingest("reference", store, corpus, lambda texts: encode(texts, bar=True))
    return Pipeline("sentence-transformers", store, lambda q: encode([q])[0], rerank)


@dataclass
class Answers:
    """One pipeline's answers to the labeled queries: per query the reranked (passage id, score) pairs, best first,
    and the rank of the first passage from an answering page (None: not among the candidates)."""

    ranked: list[list[tuple[str, float]]]
    ranks: list[int | None]

    def quality(self) -> tuple[float, float, float]:
        """(recall@1, recall@5, MRR)."""
        n = len(self.ranks)
        return (
            sum(r == 1 for r in self.ranks) / n,
            sum(r is not None and r <= 5 for r in self.ranks) / n,
            sum(1 / r for r in self.ranks if r) / n,
        )


def _evaluate(ours: Pipeline, reference: Pipeline, dtype: str, corpus: list[Passage]) -> bool:
    """Print recall@1/@5, MRR and latency per pipeline, then the verdict; True when ``ours`` agrees with the
    float32 reference within what ``dtype`` can resolve."""
    queries = load_queries()
    print(f"\nevaluation: {len(queries)} labeled queries (examples/data/queries.jsonl); a query's rank is that of the")
    print(f"first passage from a page that answers it, among the top {CANDIDATES} retrieved and reranked")
    print(
        f"  {'pipeline':<22} {'recall@1':>8} {'recall@5':>8} {'MRR':>6}   {'retrieve p50/p95':>16}  "
        f"{'rerank p50/p95':>14}"
    )
    answers = []
    for pipeline in (ours, reference):
        ranked, ranks, retrieve, rerank = [], [], [], []
        for labeled in queries:
            hits, retrieve_s, rerank_s = pipeline.search(labeled.query)
            docs = [pid.rsplit(":", 1)[0] for pid, _ in hits]
            ranks.append(next((n for n, doc in enumerate(docs, 1) if doc in labeled.relevant), None))
            ranked.append(hits)
            retrieve.append(retrieve_s * 1000)
            rerank.append(rerank_s * 1000)
        answers.append(Answers(ranked, ranks))
        recall1, recall5, mrr = answers[-1].quality()
        print(
            f"  {pipeline.name:<22} {recall1:>8.3f} {recall5:>8.3f} {mrr:>6.3f}   {_p50_p95(retrieve):>16}  "
            f"{_p50_p95(rerank):>14}"
        )
    ids = [p.id for p in corpus]
    passage_cosines = _row_cosines(ours.store.vectors(ids), reference.store.vectors(ids))
    texts = [q.query for q in queries]
    query_cosines = _row_cosines(
        np.stack([ours.embed_query(t) for t in texts]), np.stack([reference.embed_query(t) for t in texts])
    )
    lines, agree = judge(answers[0], answers[1], passage_cosines, query_cosines, dtype)
    print(f"\nverdict: {ours.name} in {dtype} against {reference.name} in float32, at {dtype}'s bounds")
    for line in lines:
        print("  " + line)
    return agree


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def judge(
    ours: Answers, reference: Answers, passage_cosines: np.ndarray, query_cosines: np.ndarray, dtype: str
) -> tuple[list[str], bool]:
    """(report lines, agree) for ``ours`` computed in ``dtype`` against the float32 ``reference``.

    Each check is what the dtype's bounds (rbln_retrieval.results.precision) let us claim: every vector within its
    cosine bound; every score of a passage both rerank within its score bound; a passage ranked in only one top list
    within that bound of the other list's last score (the reference would have scored it no higher); two
    passages in swapped order can only be a near-tie once the scores are within bound, so a query whose lists
    differ is "tied", and recall/MRR may differ by at most the share of tied queries.
    """
    from rbln_retrieval.results.precision import MIN_COSINE, score_bound

    bound, min_cosine = score_bound(dtype), MIN_COSINE[dtype]
    checks: list[tuple[str, bool]] = []
    worst_passage, worst_query = float(passage_cosines.min()), float(query_cosines.min())
    checks.append(
        (
            f"vectors   min cosine {worst_passage:.6f} over {len(passage_cosines)} passages, {worst_query:.6f} over "
            f"{len(query_cosines)} queries (bound >= {min_cosine})",
            min(worst_passage, worst_query) >= min_cosine,
        )
    )
    worst_score, pairs, tied, beyond = 0.0, 0, 0, []
    for q, (mine, theirs) in enumerate(zip(ours.ranked, reference.ranked)):
        mine_scores, their_scores = dict(mine), dict(theirs)
        for pid in mine_scores.keys() & their_scores.keys():
            worst_score = max(worst_score, abs(mine_scores[pid] - their_scores[pid]))
            pairs += 1
        # Only in one list: it must have been within bound of making the other list's cut.
        for only, scores, cut in (
            (mine_scores.keys() - their_scores.keys(), mine_scores, min(their_scores.values())),
            (their_scores.keys() - mine_scores.keys(), their_scores, min(mine_scores.values())),
        ):
            beyond += [
                f"query {q + 1}: {pid} at {scores[pid]:.4f}, the cut at {cut:.4f}"
                for pid in only
                if scores[pid] > cut + bound
            ]
        tied += [pid for pid, _ in mine] != [pid for pid, _ in theirs]
    checks.append(
        (
            f"scores    largest difference {worst_score:.1e} over {pairs} passages both reranked (bound {bound:.1e})",
            worst_score <= bound,
        )
    )
    n = len(ours.ranked)
    checks.append(
        (
            f"rankings  identical on {n - tied}/{n} queries; the other {tied} differ only by near-ties"
            + (f", except {'; '.join(beyond)}" if beyond else ""),
            not beyond,
        )
    )
    deltas = [a - b for a, b in zip(ours.quality(), reference.quality())]
    margin = tied / n
    checks.append(
        (
            "quality   recall@1 {:+.3f}, recall@5 {:+.3f}, MRR {:+.3f}".format(*deltas)
            + f" (margin {tied}/{n} = {margin:.3f}: the tied queries)",
            all(abs(d) <= margin + 1e-12 for d in deltas),
        )
    )
    agree = all(ok for _, ok in checks)
    lines = [f"{text}  {'ok' if ok else 'FAIL'}" for text, ok in checks]
    lines.append(
        f"agree: identical rankings on {n - tied}/{n} queries, every difference within {dtype}'s bounds"
        if agree
        else f"DISAGREE: a difference beyond {dtype}'s bounds (FAIL above): a defect, not rounding"
    )
    return lines, agree


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _p50_p95(milliseconds: list[float]) -> str:
    cuts = statistics.quantiles(milliseconds, n=20, method="inclusive")
    return f"{statistics.median(milliseconds):.0f}/{cuts[18]:.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
