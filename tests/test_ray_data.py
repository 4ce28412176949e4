"""Ray Data bulk embedding on a local Ray cluster: two actors on declared RBLN NPUs, every row exactly once (also
when an actor dies mid-run), vectors equal to local ones, bounded driver memory on a larger stream."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import numpy as np
import psutil
import pytest
import ray
import ray._private.state

from rbln_retrieval.ray import embed_dataset, engine_resources, score_dataset

pytestmark = pytest.mark.ray

ROWS = 2000
# The engines' own options, as in the local reference engine (minilm_engine); device "auto" falls back to the CPU.
ENGINE = {"device": "auto", "dtype": "float32"}
# Two half-CPU actors leave room on a 2-CPU cluster for Ray Data's other tasks.
POOL = {"actors": 2, "batch_size": 64, "num_cpus": 0.5}


def corpus(n: int) -> list[dict]:
    return [{"id": i, "text": f"passage {i}: {'retrieval ' * (i % 7)}on topic {i % 31}"} for i in range(n)]


def embedding_actors() -> list[dict]:
    return [a for a in ray._private.state.actors().values()
            if "_Embedder" in a["ActorClassName"] and a["State"] == "ALIVE"]


def check_exactly_once(rows: list[dict], local: np.ndarray) -> None:
    ids = [int(r["id"]) for r in rows]
    assert sorted(ids) == list(range(len(local))), "some ids are missing or repeated"
    vectors = np.stack([r["embedding"] for r in sorted(rows, key=lambda r: r["id"])])
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, local, atol=1e-6, rtol=0)


@pytest.fixture(scope="module")
def rows_and_local(minilm_engine) -> tuple[list[dict], np.ndarray]:
    rows = corpus(ROWS)
    return rows, minilm_engine.embed([r["text"] for r in rows])


def test_actors_request_rbln_when_the_cluster_has_it(ray_cluster):
    assert engine_resources() == {"num_cpus": 1.0, "resources": {"RBLN": 1}}
    assert engine_resources(0.5)["num_cpus"] == 0.5


def test_two_actors_embed_every_row_once_on_their_own_npu(ray_cluster, minilm, rows_and_local, capfd):
    rows, local = rows_and_local
    out = embed_dataset(ray.data.from_items(rows), str(minilm), **POOL, **ENGINE).take_all()
    check_exactly_once(out, local)
    assert all(set(r) == {"id", "text", "embedding"} for r in out)
    # Each actor prints which NPU Ray gave it (the log monitor forwards worker output within a second or so).
    seen: set[str] = set()
    deadline = time.monotonic() + 15
    while len(seen) < 2 and time.monotonic() < deadline:
        seen |= set(re.findall(r"embedding actor: RBLN_DEVICES=(\S+)", capfd.readouterr().out))
        time.sleep(0.5)
    assert seen == {"0", "1"}, f"actors saw RBLN_DEVICES {seen}"


def test_an_actor_killed_mid_run_still_embeds_every_row_once(ray_cluster, minilm, rows_and_local):
    rows, local = rows_and_local
    out, killed = [], []
    for batch in embed_dataset(ray.data.from_items(rows), str(minilm), **POOL, **ENGINE).iter_batches(
            batch_size=None, batch_format="numpy"):
        out += [{"id": i, "embedding": e} for i, e in zip(batch["id"], batch["embedding"])]
        if not killed:
            # A crash, not a polite stop: Ray restarts the actor and retries the batch it held.
            victim = embedding_actors()[0]
            os.kill(victim["Pid"], signal.SIGKILL)
            killed.append((victim, len(out)))
    assert killed and killed[0][1] < ROWS, "no actor was killed while rows were still pending"
    restarted = [a for a in ray._private.state.actors().values() if a["ActorID"] == killed[0][0]["ActorID"]]
    assert restarted[0]["NumRestarts"] >= 1, "the killed actor was never restarted"
    check_exactly_once(out, local)


def test_a_large_stream_keeps_driver_memory_bounded(ray_cluster, minilm):
    n = 20_000
    ds = ray.data.range(n).map_batches(lambda b: {"id": b["id"], "text": np.array([f"row {i}" for i in b["id"]])})
    process, peak, done = psutil.Process(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.05)

    baseline = process.memory_info().rss
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pool = {**POOL, "actors": 1, "num_cpus": 1}  # one actor: the figure printed is per-actor throughput
    count, started = 0, time.monotonic()
    try:
        for batch in embed_dataset(ds, str(minilm), **pool, **ENGINE).iter_batches(batch_size=None):
            count += len(batch["id"])
    finally:
        done.set()
        sampler.join()
    growth = (peak[0] - baseline) / 2**20
    output = n * 384 * 4 / 2**20
    print(f"\n{n} rows in {time.monotonic() - started:.1f} s; driver RSS {baseline / 2**20:.0f} MiB, "
          f"peak +{growth:.0f} MiB (all vectors: {output:.0f} MiB)")
    assert count == n
    assert growth < 100, f"driver memory grew by {growth:.0f} MiB while streaming"


def test_score_dataset_scores_each_pair_as_the_engine_does(ray_cluster, minilm, minilm_engine):
    pairs = [{"query": f"topic {q}", "document": f"passage {d} on topic {d % 3}"} for q in range(3) for d in range(5)]
    out = score_dataset(ray.data.from_items(pairs), str(minilm), actors=1, batch_size=8, num_cpus=0.5,
                        **ENGINE).take_all()
    by_pair = {(r["query"], r["document"]): float(r["score"]) for r in out}
    assert len(by_pair) == len(pairs)
    for q in range(3):
        docs = [p["document"] for p in pairs if p["query"] == f"topic {q}"]
        expected = minilm_engine.score(f"topic {q}", docs)
        assert [by_pair[(f"topic {q}", d)] for d in docs] == pytest.approx(expected, abs=1e-6)


def test_bad_arguments_fail_in_one_sentence(ray_cluster, minilm):
    with pytest.raises(ValueError, match="actors=0 must be a positive integer"):
        embed_dataset(ray.data.from_items([{"text": "a"}]), str(minilm), actors=0)
    with pytest.raises(TypeError, match="expected a ray.data.Dataset"):
        embed_dataset([{"text": "a"}], str(minilm))
