"""An app of four worker processes doing ingest and rerank on one host, run twice: each worker with its own engine
(RBLN_SHARE_ENGINES=0), then every worker attached to one engine per model (RBLN_SHARE_ENGINES=1: the default on
an RBLN NPU, docs/frameworks.md#one-engine-across-an-apps-processes). It prints, per run, the engines started, the
memory (RSS) of every process, the time to the first result, the ingest time and the latency of one worker's calls
made alone (a query embedded, ten passages reranked, and the round trip alone: an engine attribute read): what
attaching costs a call against an in-process engine.

    .venv/bin/python examples/shared_engine_app.py [--model M] [--reranker R] [--workers 4]

Each worker is this script with ``--worker``: LangChain's RBLNEmbeddings and RBLNReranker, driven by one JSON line
per command on its stdin, answering one JSON line on its stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_corpus import passages
from example_args import embedded_minilm

QUERY = "How do I handle an exception and still run clean-up code?"


def worker(model: str, reranker: str, device: str) -> None:
    """One process of the app: its framework objects, and a command per line on stdin."""
    from langchain_core.documents import Document

    from langchain_rbln import RBLNEmbeddings, RBLNReranker

    embeddings = RBLNEmbeddings(model=model, device=device)
    rerank = RBLNReranker(model=reranker, device=device, top_n=3)
    for line in sys.stdin:
        command = json.loads(line)
        began = time.perf_counter()
        if command["do"] == "start":  # the first call starts (or attaches to) each engine
            embeddings.embed_query(QUERY)
            rerank.compress_documents([Document(page_content=QUERY)], QUERY)
            hosts = [_host(embeddings), _host(rerank)]
            answer: dict[str, Any] = {"seconds": time.perf_counter() - began, "hosts": hosts}
        elif command["do"] == "ingest":
            vectors = embeddings.embed_documents(command["texts"])
            answer = {"seconds": time.perf_counter() - began, "count": len(vectors)}
        else:  # "calls": alone, one after another
            documents = [Document(page_content=text) for text in command["texts"]]
            embeds, reranks = [], []
            for _ in range(command["count"]):
                began = time.perf_counter()
                embeddings.embed_query(QUERY)
                embeds.append(time.perf_counter() - began)
                began = time.perf_counter()
                rerank.compress_documents(documents, QUERY)
                reranks.append(time.perf_counter() - began)
            # The round trip alone: an attribute of the engine, read in this process or asked of the holder.
            engine, trips = embeddings.engine.engine, []
            for _ in range(command["count"]):
                began = time.perf_counter()
                engine.dimension  # noqa: B018 - the read is what is timed
                trips.append(time.perf_counter() - began)
            answer = {"embed": embeds, "rerank": reranks, "round_trip": trips}
        print(json.dumps(answer), flush=True)
    embeddings.close()
    rerank.close()


def _host(framework_object: Any) -> int:
    """The pid of the process running this object's engine: this one, or the holder it is attached to."""
    engine = framework_object.engine.engine
    return int(getattr(engine, "holder_pid", os.getpid()))


def _rss_mb(pids: set[int]) -> dict[int, float]:
    """Each process's resident memory in MB, with that of its own child processes (an engine's) not listed
    themselves: a holder is the child of the worker that started it, and is counted once, as itself."""
    import psutil

    rss = {}
    for pid in sorted(pids):
        process = psutil.Process(pid)
        family = [process, *(child for child in process.children(recursive=True) if child.pid not in pids)]
        rss[pid] = sum(member.memory_info().rss for member in family) / 2**20
    return rss


class App:
    """The app's workers, started together, with their environment's sharing setting."""

    def __init__(self, args: argparse.Namespace, share: bool):
        env = {**os.environ, "RBLN_SHARE_ENGINES": "1" if share else "0"}
        command = [sys.executable, __file__, "--worker", "--model", args.model, "--reranker", args.reranker]
        self.workers = [
            subprocess.Popen(
                [*command, "--device", args.device], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
            for _ in range(args.workers)
        ]

    def ask(self, commands: list[dict[str, Any]], workers: list[subprocess.Popen[str]] | None = None) -> list[Any]:
        workers = workers or self.workers
        for process, command in zip(workers, commands, strict=True):
            assert process.stdin is not None
            process.stdin.write(json.dumps(command) + "\n")
            process.stdin.flush()
        answers = []
        for process in workers:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise SystemExit(f"worker {process.pid} exited with status {process.wait()}")
            answers.append(json.loads(line))
        return answers

    def close(self) -> None:
        for process in self.workers:
            assert process.stdin is not None
            process.stdin.close()
        for process in self.workers:
            process.wait()


def run(args: argparse.Namespace, share: bool, texts: list[str]) -> dict[str, Any]:
    app = App(args, share)
    try:
        began = time.perf_counter()
        started = app.ask([{"do": "start"}] * args.workers)
        ready = time.perf_counter() - began
        hosts = {pid for answer in started for pid in answer["hosts"]}
        # An engine per model and process that runs one (an embedder and a reranker of one model are one engine).
        engines = len(
            {(a["hosts"][0], args.model) for a in started} | {(a["hosts"][1], args.reranker) for a in started}
        )
        share_of = [texts[i :: args.workers] for i in range(args.workers)]
        began = time.perf_counter()
        app.ask([{"do": "ingest", "texts": part} for part in share_of])
        ingest = time.perf_counter() - began
        workers = {process.pid for process in app.workers}
        rss = _rss_mb(workers | hosts)
        (calls,) = app.ask([{"do": "calls", "count": args.calls, "texts": texts[:10]}], app.workers[:1])
    finally:
        app.close()
    return {
        "engines": engines,
        "rss_mb": rss,
        "holders": sorted(hosts - workers),
        "ready_s": ready,
        "ingest_s": ingest,
        "embed_ms": 1000 * statistics.median(calls["embed"]),
        "rerank_ms": 1000 * statistics.median(calls["rerank"]),
        "round_trip_ms": 1000 * statistics.median(calls["round_trip"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="the embedder (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--reranker", default=None, help="the reranker (default: the embedder)")
    parser.add_argument("--device", default="auto", choices=["auto", "rbln", "cpu"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--passages", type=int, default=200, help="passages ingested, shared out between workers")
    parser.add_argument("--calls", type=int, default=30, help="calls of each kind timed in one worker")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.model = args.model or embedded_minilm()
    args.reranker = args.reranker or args.model
    if args.worker:
        worker(args.model, args.reranker, args.device)
        return
    texts = [passage.text for passage in passages()[: args.passages]]
    results = {"in-process": run(args, False, texts), "attached": run(args, True, texts)}
    print(f"{args.workers} workers, {len(texts)} passages ingested, {args.calls} calls of each kind timed alone")
    header = ("engines", "RSS MB (sum)", "to ready s", "ingest s", "embed ms", "rerank ms", "round trip ms")
    print(f"{'':12}" + "".join(f"{name:>{len(name) + 2}}" for name in header))
    for name, result in results.items():
        row = (
            result["engines"],
            f"{sum(result['rss_mb'].values()):.0f}",
            f"{result['ready_s']:.1f}",
            f"{result['ingest_s']:.2f}",
            f"{result['embed_ms']:.2f}",
            f"{result['rerank_ms']:.2f}",
            f"{result['round_trip_ms']:.3f}",
        )
        print(f"{name:12}" + "".join(f"{value:>{len(title) + 2}}" for value, title in zip(row, header, strict=True)))
    inproc, attached = results["in-process"], results["attached"]
    memory = sum(attached["rss_mb"].values()) / sum(inproc["rss_mb"].values())
    embed, rerank = attached["embed_ms"] / inproc["embed_ms"], attached["rerank_ms"] / inproc["rerank_ms"]
    print(f"attached / in-process: memory {memory:.2f}, embed call {embed:.2f}, rerank call {rerank:.2f}")
    print(f"a call's round trip to the holder: {attached['round_trip_ms'] - inproc['round_trip_ms']:.3f} ms more")
    for name, result in results.items():
        per_process = ", ".join(
            f"{pid}{' (holder)' if pid in result['holders'] else ''}: {mb:.0f}" for pid, mb in result["rss_mb"].items()
        )
        print(f"RSS MB per process, {name}: {per_process}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
