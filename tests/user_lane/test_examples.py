"""The examples run as a user runs them (subprocesses, all started at once to share the wait for engine starts;
remote_client.py against a real `rbln-retrieval serve`, the session's MiniLM server); their printed results are
checked against the labeled data and against plain-transformers references."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import reference

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import qwen3_embedding  # noqa: E402  (constants only: the example's work is behind its __main__ guard)
import qwen3_reranker  # noqa: E402
import remote_client  # noqa: E402

# The pages that say how to run cleanup code whatever happens (the RAG examples' default question).
ANSWERING_PAGES = {"try", "exceptions"}
SCORE_ROW = re.compile(r"^  (.+?)\s{2,}(-?\d\.\d{4})  (-?\d\.\d{4})$")

pytestmark = pytest.mark.slow


def start(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def runs(tiny_models, minilm, request) -> dict[str, tuple[int, str, str]]:
    """Every example that starts an engine, started together; then remote_client.py against the session's MiniLM
    server (`rbln-retrieval serve` in float32 on the CPU, which the other tests of a plain server share; asked for
    once the examples run, so that its start, where this file is the first to ask, shares their wait);
    name -> (exit code, stdout, stderr)."""
    started = {
        "langchain": start("langchain_rag.py", "--device", "cpu"),
        "llamaindex": start("llamaindex_rag.py", "--device", "cpu"),
        "qwen3-embedding": start(
            "qwen3_embedding.py", tiny_models["qwen3-embedding"], "--device", "cpu", "--dtype", "float32"
        ),
        "qwen3-reranker": start(
            "qwen3_reranker.py", tiny_models["qwen3-reranker"], "--device", "cpu", "--dtype", "float32"
        ),
        # Two workers on a tiny model, each run once: three engine starts (one per worker, then one holder).
        "shared-engine": start(
            "shared_engine_app.py",
            "--model",
            tiny_models["bert-cls"],
            "--device",
            "cpu",
            "--workers",
            "2",
            "--passages",
            "8",
            "--calls",
            "3",
        ),
    }
    try:
        server = request.getfixturevalue("minilm_server")
    finally:
        results = {}
        for name, process in started.items():
            stdout, stderr = process.communicate(timeout=1200)
            results[name] = (process.returncode, stdout, stderr)
    remote = start("remote_client.py", "--base-url", server.url, "--model", minilm)
    stdout, stderr = remote.communicate(timeout=600)
    results["remote"] = (remote.returncode, stdout, stderr)
    return results


def succeeded(runs, name: str) -> str:
    code, stdout, stderr = runs[name]
    assert code == 0, stderr
    assert "Traceback" not in stderr and "WARNING" not in stderr, stderr
    return stdout


def ranked_pages(stdout: str) -> list[tuple[float, str]]:
    return [(float(score), page) for score, page in re.findall(r"^\d\. (-?\d\.\d{3})  \[([\w-]+)\]", stdout, re.M)]


def test_langchain_rag_reranks_an_answering_page_first_and_prints_a_prompt(runs):
    stdout = succeeded(runs, "langchain")
    ranked = ranked_pages(stdout)
    assert len(ranked) == 3 and ranked[0][1] in ANSWERING_PAGES, stdout
    assert [score for score, _ in ranked] == sorted((score for score, _ in ranked), reverse=True)
    assert "System: Answer the question using only the context below." in stdout
    assert "Human: How do I run cleanup code whether or not an exception occurs?" in stdout
    assert "Context:\n[" in stdout and stdout.count("\n[") >= 3  # the chunks, each under its page title


def test_llamaindex_rag_prints_reranked_source_nodes(runs):
    stdout = succeeded(runs, "llamaindex")
    ranked = ranked_pages(stdout)
    assert len(ranked) == 3 and ranked[0][1] in ANSWERING_PAGES, stdout
    assert [score for score, _ in ranked] == sorted((score for score, _ in ranked), reverse=True)
    assert re.search(r"^10 documents -> \d+ nodes; retrieved 8, reranked to 3$", stdout, re.M), stdout


def test_qwen3_embedding_scores_equal_the_transformers_reference(runs, tiny_models):
    stdout = succeeded(runs, "qwen3-embedding")
    printed = [tuple(map(float, m.groups()[1:])) for m in map(SCORE_ROW.match, stdout.splitlines()) if m]
    assert len(printed) == 2, stdout
    path = str(tiny_models["qwen3-embedding"])
    prefix = f"Instruct: {qwen3_embedding.TASK}\nQuery:"
    assert f"query prompt: {prefix!r}" in stdout
    queries = reference.embed(path, qwen3_embedding.QUERIES, pooling="LAST", max_length=512, prefix=prefix)
    documents = reference.embed(path, qwen3_embedding.DOCUMENTS, pooling="LAST", max_length=512)
    expected = queries @ documents.T
    for row, want in zip(printed, expected):
        assert row == pytest.approx(want, abs=2e-4)


def test_qwen3_reranker_scores_equal_the_transformers_reference(runs, tiny_models):
    stdout = succeeded(runs, "qwen3-reranker")
    printed = [tuple(map(float, m.groups()[1:])) for m in map(SCORE_ROW.match, stdout.splitlines()) if m]
    assert len(printed) == 2, stdout
    path = str(tiny_models["qwen3-reranker"])
    for query, row in zip(qwen3_reranker.QUERIES, printed):
        want = reference.qwen3_reranker_scores(
            path, query, qwen3_reranker.DOCUMENTS, instruction=qwen3_reranker.TASK, max_length=512
        )
        assert row == pytest.approx(want, abs=2e-4)
    assert "rerank for 'Explain gravity':" in stdout


def test_remote_client_gets_the_local_scores_from_the_server(runs, minilm):
    stdout = succeeded(runs, "remote")
    assert "LangChain RBLNEmbeddings: 3 vectors of 384 dims" in stdout
    assert "LlamaIndex RBLNEmbedding: query vector of 384 dims" in stdout
    printed = re.findall(r"^  (\d\.\d{3})  (.+)$", stdout, re.M)
    documents = reference.embed(str(minilm), remote_client.DOCUMENTS, pooling="MEAN", max_length=256)
    query = reference.embed(str(minilm), [remote_client.QUERY], pooling="MEAN", max_length=256)[0]
    cosine = documents @ query
    order = list(np.argsort(-cosine))
    order += order[:2]  # LangChain ranks all three, the LlamaIndex postprocessor keeps the best two
    assert [text for _, text in printed] == [remote_client.DOCUMENTS[i] for i in order]
    assert [float(score) for score, _ in printed] == pytest.approx([cosine[i] for i in order], abs=6e-4)


def test_shared_engine_app_runs_its_workers_on_one_engine_when_attached(runs):
    """examples/shared_engine_app.py: in-process, an engine per worker; attached, one engine in one holder process,
    and every figure of its table printed."""
    code, stdout, stderr = runs["shared-engine"]
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    results = json.loads(stdout.splitlines()[-1])
    assert results["in-process"]["engines"] == 2 and results["in-process"]["holders"] == []
    assert results["attached"]["engines"] == 1 and len(results["attached"]["holders"]) == 1
    assert len(results["attached"]["rss_mb"]) == 3, "two workers and the holder measured"
    assert re.search(r"^attached / in-process: memory \d\.\d\d, embed call \d+\.\d\d", stdout, re.M), stdout


@pytest.mark.parametrize(
    ("script", "checkpoint"),
    [("qwen3_embedding.py", "Qwen/Qwen3-Embedding-0.6B"), ("qwen3_reranker.py", "Qwen/Qwen3-Reranker-0.6B")],
)
def test_qwen3_examples_say_what_to_pass_without_a_model(script, checkpoint):
    result = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stdout == ""
    assert f"needs the {checkpoint} weights" in result.stderr
    assert f"python {EXAMPLES / script} {checkpoint}," in result.stderr


def test_qwen3_embedding_example_refuses_another_family(minilm, tmp_path):
    for model, expected in [
        (minilm, "is a bi-encoder model, not Qwen/Qwen3-Embedding-0.6B"),
        (tmp_path / "missing", "does not exist"),
    ]:
        result = subprocess.run(
            [sys.executable, str(EXAMPLES / "qwen3_embedding.py"), str(model)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode != 0 and expected in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def hybrid_run(tiny_models) -> str:
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLES / "hybrid_qdrant.py"),
            str(tiny_models["bge-m3"]),
            "--pages",
            "4",
            "--device",
            "cpu",
            "--dtype",
            "float32",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return result.stdout


def test_hybrid_qdrant_example_prints_dense_sparse_and_fused_rankings(hybrid_run):
    sections = re.split(r"^(dense|sparse|hybrid):$", hybrid_run, flags=re.M)
    assert re.search(r"^25 passages indexed \(dense 64 dims \+ sparse\)$", sections[0], re.M), hybrid_run
    rows = {
        name: [float(s) for s in re.findall(r"^\d\. (\d+\.\d{4})  \[[\w-]+\] ", body, re.M)]
        for name, body in zip(sections[1::2], sections[2::2])
    }
    assert list(rows) == ["dense", "sparse", "hybrid"] and all(len(r) == 3 for r in rows.values()), hybrid_run
    for scores in rows.values():
        assert scores == sorted(scores, reverse=True)
    assert rows["sparse"][0] > 0
    # Reciprocal rank fusion of two top-3 lists: each score is 1/(rank+1) from one side or a sum from both.
    fused = {round(a + b, 4) for a in (0, 1 / 2, 1 / 3, 1 / 4) for b in (0, 1 / 2, 1 / 3, 1 / 4)} - {0}
    assert set(rows["hybrid"]) <= fused, rows["hybrid"]


def test_hybrid_example_refuses_a_model_without_a_sparse_head(minilm):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "hybrid_qdrant.py"), str(minilm)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "is a bi-encoder model without bge-m3's sparse head" in result.stderr
    assert "Traceback" not in result.stderr
