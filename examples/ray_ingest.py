"""Ingest on Ray: read a folder of text files or parquet/JSONL files, chunk, embed with Ray Data actors, write a
persistent Chroma collection, then query it from LangChain with RBLNEmbeddings.

    python examples/ray_ingest.py PATH [PATH ...] --persist-dir DIR [--model ID_OR_DIR] [--actors N]
        [--question "..."] [--address auto]

PATH: a folder (every *.txt / *.md file in it, recursively), *.parquet or *.jsonl files with a "text" column.
Without --address a local Ray cluster starts on this machine; with it, the job runs on that cluster (the
persist directory is written by this driver process).
"""

from __future__ import annotations

COLLECTION = "ray-ingest"
CHUNK_CHARS = 800  # stays under all-MiniLM-L6-v2's 256-token limit


def read(paths: list[str]):
    """One dataset with "source" and "text" columns from folders, parquet and JSONL files."""
    from pathlib import Path

    import ray

    parts = []
    for path in map(Path, paths):
        if path.is_dir():
            files = [str(p) for p in sorted(path.rglob("*")) if p.suffix in (".txt", ".md")]
            ds = ray.data.read_binary_files(files, include_paths=True).map(
                lambda row: {"source": row["path"], "text": row["bytes"].decode("utf-8", errors="replace")}
            )
        elif path.suffix == ".parquet":
            ds = ray.data.read_parquet(str(path), columns=["text"])
            ds = ds.map(lambda row, name=str(path): {"source": name, "text": row["text"]})
        elif path.suffix in (".jsonl", ".ndjson"):
            ds = ray.data.read_json(str(path), lines=True).select_columns(["text"])
            ds = ds.map(lambda row, name=str(path): {"source": name, "text": row["text"]})
        else:
            raise SystemExit(f"{path}: not a folder, .parquet or .jsonl file.")
        parts.append(ds)
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]


def chunk(row: dict) -> list[dict]:
    """The row's chunks, each with an id made of its source and a digest of its text: the rows of one JSONL or
    parquet file share a source, and a re-run over the same files must reproduce the same ids."""
    import hashlib

    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(chunk_size=CHUNK_CHARS, chunk_overlap=80)
    return [
        {
            "id": f"{row['source']}#{hashlib.sha256(text.encode()).hexdigest()[:16]}",
            "source": row["source"],
            "text": text,
        }
        for text in splitter.split_text(row["text"])
    ]


if __name__ == "__main__":
    from rbln_retrieval.quiet import quiet_startup

    quiet_startup()
    import argparse
    import time

    import chromadb
    import ray
    from example_args import embedded_minilm
    from langchain_chroma import Chroma

    from langchain_rbln import RBLNEmbeddings
    from rbln_retrieval.ray import embed_dataset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--persist-dir", required=True)
    parser.add_argument("--model", default=embedded_minilm(), help="Hugging Face id or directory")
    parser.add_argument("--actors", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--question", default="How do I run cleanup code whether or not an exception occurs?")
    parser.add_argument("--address", help="an existing Ray cluster (default: start one here)")
    args = parser.parse_args()

    ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False  # one progress line below instead
    client = chromadb.PersistentClient(args.persist_dir, settings=chromadb.Settings(anonymized_telemetry=False))
    collection = client.get_or_create_collection(COLLECTION, metadata={"hnsw:space": "cosine"})

    vectors = embed_dataset(
        read(args.paths).flat_map(chunk), args.model, actors=args.actors, batch_size=args.batch_size
    )
    started, written, shown = time.monotonic(), 0, 0.0
    for batch in vectors.iter_batches(batch_size=512, batch_format="numpy"):
        # upsert: a re-run over the same files replaces their chunks instead of duplicating them. Identical chunks
        # of one source share an id and are stored once (Chroma refuses a repeated id within one call).
        rows = list({chunk_id: row for row, chunk_id in enumerate(batch["id"].tolist())}.values())
        collection.upsert(
            ids=batch["id"][rows].tolist(),
            embeddings=batch["embedding"][rows],
            documents=batch["text"][rows].tolist(),
            metadatas=[{"source": s} for s in batch["source"][rows].tolist()],
        )
        written += len(rows)
        if time.monotonic() - shown > 5:
            shown = time.monotonic()
            print(f"{written} chunks written, {written / (shown - started):.0f}/s", flush=True)
    print(f"{written} chunks in {time.monotonic() - started:.1f} s -> {args.persist_dir} ({COLLECTION})")
    ray.shutdown()

    # Any LangChain (or LlamaIndex) app now queries the same collection with the same model.
    store = Chroma(client=client, collection_name=COLLECTION, embedding_function=RBLNEmbeddings(model=args.model))
    for doc, score in store.similarity_search_with_score(args.question, k=3):
        print(f"{score:.3f}  {doc.metadata['source']}: {doc.page_content[:100]!r}")
