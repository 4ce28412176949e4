"""`npus` end to end on a simulated host of two NPUs (tests/npu_host: two device nodes; tests/standin: the stand-in
compiler, which logs every runtime it opens with the process and the RBLN_VISIBLE_DEVICES it saw): a server of an
embedder on ``npus = [0]`` and a cross-encoder on ``npus = [1]`` starts each model's engine on its own NPU, and both
answer. Each model compiles one shape of its own, which tells their runtimes apart in the log."""

from __future__ import annotations

import json
import os
import time

import httpx
import pytest
from npu import STANDIN, rbln_options
from servers import Server

pytestmark = pytest.mark.server

NPU_HOST = STANDIN.parent / "npu_host"
# One shape per model: the embedder's runtimes take 64 tokens, the reranker's 128.
PLACED = {"bert-cls": (0, 64), "bert-cross-encoder": (1, 128)}


def test_each_model_runs_on_the_npu_its_entry_names_and_both_answer(tiny_models, tmp_path):
    runtimes = tmp_path / "runtimes.jsonl"
    env = {
        "PYTHONPATH": os.pathsep.join([str(STANDIN), str(NPU_HOST), os.environ.get("PYTHONPATH", "")]),
        "REBEL_STANDIN_NPU": "RBLN-CA25",
        "REBEL_STANDIN_DEVICES": "2",
        "REBEL_STANDIN_RUNTIME_LOG": str(runtimes),
        "RBLN_RETRIEVAL_CACHE_DIR": str(tmp_path / "compile-cache"),
        "RBLN_VISIBLE_DEVICES": "0,1",  # the server's NPUs: each entry narrows its engine's to its own
    }
    paths = {name: str(tiny_models[name]) for name in PLACED}
    entries = [
        {"model": paths[name], "npus": [npu], "max_length": tokens, **rbln_options(shapes=[[1, tokens]])}
        for name, (npu, tokens) in PLACED.items()
    ]
    began = time.monotonic()
    server = Server(entries, tmp_path / "serve.log", env=env)
    try:
        server.wait_ready()
        embedded = httpx.post(
            server.url + "/v1/embeddings", json={"model": paths["bert-cls"], "input": ["a cat"]}, timeout=300
        )
        assert embedded.status_code == 200, embedded.text
        reranked = httpx.post(
            server.url + "/v1/rerank",
            json={"model": paths["bert-cross-encoder"], "query": "a cat", "documents": ["a cat sat", "stocks"]},
            timeout=300,
        )
        assert reranked.status_code == 200, reranked.text
    finally:
        server.stop()
    print(f"two models on two simulated NPUs: started and answered in {time.monotonic() - began:.0f} s")
    opened = [json.loads(line) for line in runtimes.read_text().splitlines()]
    by_tokens = {
        tokens: [r for r in opened if r["shapes"] and r["shapes"][0][-1] == tokens] for _, tokens in PLACED.values()
    }
    for name, (npu, tokens) in PLACED.items():
        seen = by_tokens[tokens]
        assert seen, f"{name}'s engine opened no runtime: {opened}"
        assert {(r["visible"], r["device"]) for r in seen} == {(str(npu), 0)}, f"{name} on NPU {npu}: {seen}"
    pids = [{r["pid"] for r in by_tokens[tokens]} for _, tokens in PLACED.values()]
    assert not pids[0] & pids[1], "each model's engine runs in a process of its own"
