"""Ray Data bulk embedding on a local Ray cluster: two actors on declared RBLN NPUs, every row exactly once (also
when an actor dies mid-run), vectors equal to local ones, bounded driver memory on a 122 MiB stream."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray
import ray._private.state

from rbln_retrieval.local.engine_args import resolve_dtype
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
    return [
        a for a in ray._private.state.actors().values() if "_Embedder" in a["ActorClassName"] and a["State"] == "ALIVE"
    ]


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
    # Each actor prints which NPU Ray gave it (the log monitor forwards worker output with some delay).
    seen: set[str] = set()
    deadline = time.monotonic() + 300  # a failure bound: the wait ends once both actors' lines are seen
    while len(seen) < 2 and time.monotonic() < deadline:
        seen |= set(re.findall(r"embedding actor: RBLN_DEVICES=(\S+)", capfd.readouterr().out))
        time.sleep(0.5)
    assert seen == {"0", "1"}, f"actors saw RBLN_DEVICES {seen}"


def test_an_actor_killed_mid_run_still_embeds_every_row_once(ray_cluster, minilm, rows_and_local):
    rows, local = rows_and_local
    out, killed = [], []
    for batch in embed_dataset(ray.data.from_items(rows), str(minilm), **POOL, **ENGINE).iter_batches(
        batch_size=None, batch_format="numpy"
    ):
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


class PeakMemory:
    """The driver's resident memory, sampled in a thread: peak growth over the value at start, in MiB, of all of
    it and of its private part (pages of Ray's object store that the driver maps count as shared)."""

    def __init__(self, interval: float = 0.05):
        self.process, self.interval = psutil.Process(), interval
        self.baseline = self.peak = self._now()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _now(self) -> np.ndarray:
        info = self.process.memory_info()
        return np.array([info.rss, info.rss - info.shared])

    def _sample(self) -> None:
        while not self.done.is_set():
            self.peak = np.maximum(self.peak, self._now())
            time.sleep(self.interval)

    def __enter__(self) -> PeakMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.done.set()
        self.thread.join()

    @property
    def growth_mib(self) -> tuple[float, float]:
        rss, private = (self.peak - self.baseline) / 2**20
        return float(rss), float(private)


# The stream's size in bytes is what makes the driver's memory bound mean something (a driver that kept what it
# consumed would grow by half of it), not its rows: 20,000 rows with 6 KiB each carry what 100,000 rows with 1 KiB
# did, with a fifth of the engine's work.
ROWS_STREAMED, TOPICS, PAYLOAD = 20_000, 97, 6144


def synthetic_rows(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # Made inside Ray Data (the driver never holds the input): about 8 tokens of text, equal for ids with equal
    # id % TOPICS, and a pass-through column that makes the stream about 120 MiB.
    ids = batch["id"]
    return {
        "id": ids,
        "text": np.array([f"a passage on topic {i % TOPICS} of the corpus" for i in ids]),
        "payload": np.zeros((len(ids), PAYLOAD), dtype=np.uint8) + (ids % 251).astype(np.uint8)[:, None],
    }


def test_a_122_mib_stream_embeds_every_id_once_with_bounded_driver_memory(ray_cluster, tiny_models):
    # A tiny random-weight encoder: this test is about the stream (identity, exactly once, the driver's memory),
    # which MiniLM's compute would only slow down; vectors equal to local ones are the 2,000-row tests' job.
    n = ROWS_STREAMED
    ds = ray.data.range(n, override_num_blocks=100).map_batches(synthetic_rows)  # blocks of 200 rows, 1.2 MiB
    pool = {**POOL, "actors": 1, "num_cpus": 1, "batch_size": n // 100}
    ray.data.range(10).map_batches(synthetic_rows).take_all()  # Ray Data's first run in the driver sets itself up
    seen, count, peaks = np.zeros(n, dtype=np.uint8), 0, []  # peaks: the peak growth (MiB) after each tenth
    references = np.full((TOPICS, 64), np.nan, dtype=np.float32)  # each topic's first vector; its rows equal it
    started = time.monotonic()
    with PeakMemory() as memory:
        for batch in embed_dataset(ds, str(tiny_models["bert-cls"]), **pool, **ENGINE).iter_batches(
            batch_size=None, batch_format="numpy"
        ):
            ids = batch["id"].astype(np.int64)
            np.add.at(seen, ids, 1)
            count += len(ids)
            if count * 10 // n > len(peaks):
                peaks.append(memory.growth_mib[1])
            assert (batch["payload"] == (ids % 251)[:, None]).all(), "a pass-through column lost its row"
            topics, vectors = ids % TOPICS, batch["embedding"]
            for row in np.flatnonzero(np.isnan(references[topics, 0])):
                references[topics[row]] = vectors[row]
            np.testing.assert_allclose(vectors, references[topics], atol=1e-5)
    seconds = time.monotonic() - started
    stream = n * (PAYLOAD + 64 * 4) / 2**20
    rss, private = memory.growth_mib
    second_half = private - peaks[4]
    print(
        f"\n{n} rows in {seconds:.0f} s; driver RSS {memory.baseline[0] / 2**20:.0f} MiB, peak +{rss:.0f} MiB "
        f"(private +{private:.0f} MiB; after each tenth: {', '.join(f'{p:.0f}' for p in peaks)}; in the second "
        f"half: +{second_half:.0f} MiB) for a {stream:.0f} MiB stream"
    )
    assert (seen == 1).all(), f"{int((seen == 0).sum())} ids missing, {int((seen > 1).sum())} repeated"
    distances = np.linalg.norm(references[:, None] - references[None], axis=-1) + np.eye(TOPICS)
    assert distances.min() > 1e-4, "two topics got the same vector"
    # The driver's memory grows by a fixed amount while the pipeline starts (measured: all of it before the first
    # tenth); a driver that kept what it consumed would grow by half the stream in the second half.
    assert second_half < stream / 8, f"the driver's private memory grew by {second_half:.0f} MiB in the second half"


def test_bfloat16_actors_equal_a_local_bfloat16_engine(ray_cluster, minilm, minilm_bf16_engine, minilm_engine):
    """Ray == local in bfloat16: the actors batch other rows together, so within two paths' bound."""
    # Imported here: Ray's workers import this module to unpickle its row functions, without tests/ on their path.
    from tolerances import BF16_OPTIONS, assert_bf16_close_to_float32, assert_bf16_paths_agree

    rows = corpus(48)
    out = embed_dataset(ray.data.from_items(rows), str(minilm), actors=1, batch_size=16, num_cpus=0.5, **BF16_OPTIONS)
    vectors = np.stack([r["embedding"] for r in sorted(out.take_all(), key=lambda r: r["id"])])
    texts = [r["text"] for r in rows]
    assert_bf16_paths_agree(vectors, minilm_bf16_engine.embed(texts))
    assert_bf16_close_to_float32(vectors, minilm_engine.embed(texts))


def test_score_dataset_scores_each_pair_as_the_engine_does(ray_cluster, minilm, minilm_engine):
    pairs = [{"query": f"topic {q}", "document": f"passage {d} on topic {d % 3}"} for q in range(3) for d in range(5)]
    out = score_dataset(
        ray.data.from_items(pairs), str(minilm), actors=1, batch_size=8, num_cpus=0.5, **ENGINE
    ).take_all()
    by_pair = {(r["query"], r["document"]): float(r["score"]) for r in out}
    assert len(by_pair) == len(pairs)
    for q in range(3):
        docs = [p["document"] for p in pairs if p["query"] == f"topic {q}"]
        expected = minilm_engine.score(f"topic {q}", docs)
        assert [by_pair[(f"topic {q}", d)] for d in docs] == pytest.approx(expected, abs=1e-6)


def test_a_batch_that_kills_its_actor_every_time_fails_the_job_naming_its_rows(ray_cluster, minilm):
    # One batch on one actor, long enough (400 texts of max_length tokens: seconds of CPU) to be in flight when the
    # killer, watching the job's attempt counter, sees it start; the killer SIGKILLs the actor at every attempt, as
    # the kernel's OOM killer would at a batch that exhausts its memory, so the batch never finishes.
    texts = [{"id": 100 + i, "text": f"row {i} " + "retrieval " * 300} for i in range(400)]
    rows = ray.data.from_items(texts, override_num_blocks=1)
    pool = {**POOL, "actors": 1, "batch_size": 400}

    def counters() -> list[dict]:
        return [a for a in ray._private.state.actors().values() if "_BatchAttempts" in a["ActorClassName"]]

    earlier = {a["ActorID"] for a in counters()}  # other jobs' counters: only this job's is watched
    dataset = embed_dataset(rows, str(minilm), **pool, max_batch_attempts=2, **ENGINE)
    done, kills = threading.Event(), []

    def kill_every_attempt() -> None:
        seen = 0
        while not done.is_set():
            alive = [a for a in counters() if a["State"] == "ALIVE" and a["ActorID"] not in earlier]
            attempts = (
                max(ray.get(ray.get_actor(alive[0]["Name"]).pending.remote()).values(), default=0) if alive else 0
            )
            if seen < attempts <= 2 and embedding_actors():  # the third start is the guard's to refuse
                os.kill(embedding_actors()[0]["Pid"], signal.SIGKILL)
                kills.append(attempts)
                seen = attempts
            done.wait(0.05)

    killer = threading.Thread(target=kill_every_attempt, daemon=True)
    killer.start()
    try:
        with pytest.raises(Exception) as failure:
            dataset.take_all()
    finally:
        done.set()
        killer.join()
    assert kills == [1, 2], kills
    assert "The batch of 400 rows with ids 100 to 499 was started 2 times and its actor died under it every time" in (
        str(failure.value)
    )


def test_identical_rows_over_four_actors_are_each_embedded_once(ray_cluster, minilm, minilm_engine):
    """Attempts are counted per batch, not per content: four actors embedding identical batches at once (more than
    max_batch_attempts) is no batch started four times, and no batch's finish resets another's count."""
    quarter = {**POOL, "actors": 4, "num_cpus": 0.25, "ray_remote_args": {"resources": {}}}  # 2 NPUs declared
    out = embed_dataset(ray.data.from_items([{"text": "x"}] * 2048), str(minilm), **quarter, **ENGINE).take_all()
    assert len(out) == 2048 and all(r["text"] == "x" for r in out)
    vectors = np.stack([r["embedding"] for r in out])
    np.testing.assert_allclose(vectors, np.repeat(minilm_engine.embed(["x"]), 2048, axis=0), atol=1e-6, rtol=0)


def test_actors_that_die_in_their_constructor_are_not_restarted_forever(ray_cluster, minilm):
    # Each actor's process dies as it constructs its engine (tests/crash_in_engine on its PYTHONPATH), as an actor
    # the OOM killer ends at every start; Ray restarts it, and past max_batch_attempts deaths (2) the third death's
    # restart raises instead of dying, which ends the job.
    crash_in_engine = Path(__file__).resolve().parents[1] / "crash_in_engine"
    path = os.pathsep.join([str(crash_in_engine), os.environ.get("PYTHONPATH", "")])
    crash = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}, "resources": {}}
    pool = {**POOL, "actors": 1, "ray_remote_args": crash}
    dataset = embed_dataset(ray.data.from_items(corpus(8)), str(minilm), **pool, max_batch_attempts=2, **ENGINE)
    with pytest.raises(Exception) as failure:
        dataset.take_all()
    assert "The job's actors died in their constructor 3 times" in str(failure.value), str(failure.value)[-2000:]


def test_bad_arguments_fail_in_one_sentence(ray_cluster, minilm):
    with pytest.raises(ValueError, match="actors=0 must be a positive integer"):
        embed_dataset(ray.data.from_items([{"text": "a"}]), str(minilm), actors=0)
    with pytest.raises(ValueError, match="max_batch_attempts=0 must be a positive integer"):
        embed_dataset(ray.data.from_items([{"text": "a"}]), str(minilm), max_batch_attempts=0)
    with pytest.raises(TypeError, match=r"expected a ray\.data\.Dataset"):
        embed_dataset([{"text": "a"}], str(minilm))


PASSAGES = {
    "volcanoes.txt": "A volcano erupts when molten rock, called magma, rises through the crust and flows out as lava.",
    "baking.md": "Bread dough rises because yeast ferments the sugars in flour and releases carbon dioxide.",
    "tides.txt": "Ocean tides rise and fall twice a day, pulled by the gravity of the moon and the sun.",
}
# Rows of one file share a source; the repeated row is stored once.
JSONL_PASSAGES = [
    "Chess is a board game for two players; each starts with sixteen pieces.",
    "A violin has four strings and is played with a bow made of horsehair.",
    "Chess is a board game for two players; each starts with sixteen pieces.",
]


def test_the_ray_ingest_example_writes_a_store_that_rbln_embeddings_queries(
    ray_cluster, minilm, minilm_engine, tmp_path
):
    import json
    import subprocess
    import sys
    from pathlib import Path

    import chromadb
    from langchain_chroma import Chroma

    from langchain_rbln import RBLNEmbeddings

    folder = tmp_path / "passages"
    folder.mkdir()
    for name, text in PASSAGES.items():
        (folder / name).write_text(text)
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t}) + "\n" for t in JSONL_PASSAGES))
    store = tmp_path / "store"
    example = Path(__file__).resolve().parents[2] / "examples" / "ray_ingest.py"
    # The example joins this module's cluster instead of starting one of its own.
    result = subprocess.run(
        [
            sys.executable,
            str(example),
            str(folder),
            str(jsonl),
            "--persist-dir",
            str(store),
            "--model",
            str(minilm),
            "--address",
            ray_cluster.get_runtime_context().gcs_address,
            "--question",
            "What comes out of a volcano?",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    unique = len(PASSAGES) + len(set(JSONL_PASSAGES))  # each passage is one chunk
    assert re.search(r"^\d+ chunks in [\d.]+ s -> ", result.stdout, re.M), result.stdout
    hits = re.findall(r"^-?\d\.\d{3}  (.+?): '(.*)'$", result.stdout, re.M)  # the example's own query, best first
    assert hits and hits[0] == (str(folder / "volcanoes.txt"), PASSAGES["volcanoes.txt"]), result.stdout

    client = chromadb.PersistentClient(str(store), settings=chromadb.Settings(anonymized_telemetry=False))
    collection = client.get_collection("ray-ingest")
    assert collection.count() == unique
    embeddings = RBLNEmbeddings(model=str(minilm), device="cpu", dtype="float32")  # the local engine's options
    vector_store = Chroma(client=client, collection_name="ray-ingest", embedding_function=embeddings)
    for question, source, text in [
        ("Why does bread dough rise?", str(folder / "baking.md"), PASSAGES["baking.md"]),
        ("How many strings does a violin have?", str(jsonl), JSONL_PASSAGES[1]),
    ]:
        (top, _), *_ = vector_store.similarity_search_with_score(question, k=3)
        assert (top.metadata["source"], top.page_content) == (source, text), question
    stored = collection.get(where={"source": str(jsonl)}, include=["documents", "embeddings"])
    assert sorted(stored["documents"]) == sorted(set(JSONL_PASSAGES))
    # The example runs in the dtype "auto" picks: bfloat16 on CPUs with AVX512_BF16, where it is within the
    # promise of the local float32 engine rather than equal to it.
    from tolerances import assert_matches_local

    auto = resolve_dtype("auto", "cpu")
    assert_matches_local(stored["embeddings"], minilm_engine.embed(stored["documents"]), auto, atol=1e-6)
