"""Ray Serve: two replicas of the app `rbln-retrieval serve` builds, behind Ray's proxy, each serving MiniLM and a
tiny cross-encoder from config entries as `serve --config` reads them (one app, dispatching by ``model``, the
reranker's own limit refusing its requests only), guard the same routes with the same key and size limit, answer
RemoteEngine exactly as local embedding does, and keep answering when one replica is killed. An entry's ``npus``
are positions among the NPUs Ray gives the replica."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import ray._private.state
from corpus import passages
from ray import serve
from servers import GUARDED, PROBES, free_port

from rbln_retrieval.engines.protocol import DESCRIBE_PATH, QUANTIZED_EMBED_PATH
from rbln_retrieval.ray.serve import pooling_app, replica_devices, replica_npus
from rbln_retrieval.remote import RemoteAuthError, RemoteEngine
from rbln_retrieval.server.config import model_entry

pytestmark = pytest.mark.ray

API_KEY = "ray-serve-key-8d1e"
RERANKER_MAX_CHARS = 300  # the reranker entry's own limit; MiniLM takes the server's


def replicas() -> list[dict]:
    return [
        a
        for a in ray._private.state.actors().values()
        if a["ActorClassName"].startswith("ServeReplica:") and a["State"] == "ALIVE"
    ]


@pytest.fixture(scope="module")
def reranker(tiny_models) -> str:
    return str(tiny_models["bert-cross-encoder"])


@pytest.fixture(scope="module")
def proxy_url(ray_cluster, minilm, reranker, tmp_path_factory):
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    config = tmp_path_factory.mktemp("ray-serve") / "models.toml"
    config.write_text(
        f'[[models]]\nmodel = "{minilm}"\n\n[[models]]\nmodel = "{reranker}"\nmax_input_chars = {RERANKER_MAX_CHARS}\n'
    )
    app = pooling_app(config=config, api_key=API_KEY, num_replicas=2, num_cpus=0.5, device="cpu", dtype="float32")
    serve.run_many([serve.RunTarget(app, name="retrieval", route_prefix="/")], wait_for_applications_running=False)
    try:
        wait_running("retrieval", ray_cluster)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def wait_running(name: str, ray, deadline_s: float = 900) -> None:
    """Until the app runs. serve.run waits without end, also on replicas that never start (Ray's memory monitor
    kills a starting replica, or its Serve controller, on a host out of memory): the fixture fails instead, with
    Ray's status and the tail of each replica's log."""
    deadline = time.monotonic() + deadline_s
    while (status := serve.status().applications[name]).status != "RUNNING":
        if status.status == "DEPLOY_FAILED" or time.monotonic() > deadline:
            logs = Path(ray._private.worker._global_node.get_session_dir_path()) / "logs"
            tails = [f"{log.name}: {log.read_text()[-1500:]}" for log in sorted(logs.glob("serve/replica_*.log"))]
            raylet = (logs / "raylet.err").read_text() if (logs / "raylet.err").exists() else ""
            state = f"{name} is {status.status} (waited {deadline_s} s at most): {status}"
            pytest.fail("\n".join([state, raylet, *tails]))
        time.sleep(1)


def test_same_routes_key_and_limits_as_rbln_retrieval_serve(proxy_url, minilm, reranker):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=proxy_url, timeout=120) as client:
        for path in PROBES:
            assert client.get(path).status_code == 200, path
        for method, path in GUARDED:
            assert client.request(method, path, json={}).status_code == 401, (method, path)
        models = client.get("/v1/models", headers=headers).json()
        assert [m["id"] for m in models["data"]] == [str(minilm), reranker]
        described = client.get(DESCRIBE_PATH, headers=headers).json()["models"]
        assert [d["model"] for d in described] == [str(minilm), reranker]
        body = {"model": str(minilm), "input": ["x"], "precision": "binary"}
        quantized = client.post(QUANTIZED_EMBED_PATH, json=body, headers=headers)
        assert quantized.status_code == 200, quantized.text
        too_big = client.post("/v1/embeddings", json={"input": ["x" * 3_000_000]}, headers=headers)
        assert too_big.status_code == 413, too_big.text
    with RemoteEngine(minilm, base_url=proxy_url, api_key="wrong") as remote, pytest.raises(RemoteAuthError):
        remote.embed(["x"])


def test_one_app_serves_both_models_by_name_each_under_its_own_limits(proxy_url, minilm, reranker):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    documents = ["a cat sat on the mat", "stocks fell sharply today"]
    long = "word " * (RERANKER_MAX_CHARS // 5 + 1)
    with httpx.Client(base_url=proxy_url, timeout=120, headers=headers) as client:
        ranked = client.post("/v1/rerank", json={"model": reranker, "query": "a cat", "documents": documents})
        assert ranked.status_code == 200, ranked.text
        assert sorted(row["index"] for row in ranked.json()["results"]) == [0, 1]
        tei = client.post("/rerank", json={"query": "a cat", "texts": documents})  # no model: the only reranker
        assert tei.status_code == 200, tei.text
        refused = client.post("/v1/rerank", json={"model": reranker, "query": "a cat", "documents": [long]})
        assert refused.status_code == 413, refused.text
        assert f"over the model {reranker}'s max_input_chars of {RERANKER_MAX_CHARS}" in refused.text
        embedded = client.post("/v1/embeddings", json={"model": str(minilm), "input": [long]})
        assert embedded.status_code == 200, embedded.text


def test_an_entrys_npus_are_positions_among_the_npus_ray_gave_the_replica():
    entries = [model_entry({"model": "a", "npus": [0]}), model_entry({"model": "b", "npus": [1, 2]})]
    assert replica_npus(entries) == 3 and replica_npus([model_entry("c")]) == 1
    assert replica_devices(entries[1], ["4", "5", "7"]) == {"RBLN_VISIBLE_DEVICES": "5,7"}
    assert replica_devices(model_entry("c"), ["4"]) == {}, "unset: the replica's NPUs as Ray set them"
    with pytest.raises(ValueError) as error:
        replica_devices(entries[1], ["4", "5"])
    assert str(error.value) == (
        "b: npus=[1, 2] names the replica's NPU 2, but Ray gave the replica 2 (4,5); a replica asks for one more "
        "than the highest named."
    )


def test_remote_engine_equals_local_and_survives_a_killed_replica(proxy_url, minilm, minilm_engine):
    texts = passages()[:64]
    local = minilm_engine.embed(texts)
    local_query = minilm_engine.embed(["how do exceptions work?"], kind="query")
    # A failure bound only: once a replica is killed the survivor holds every caller's requests while the replacement
    # starts beside it, so one request's wait is set by the host's load, not by the client (the default is 60 s).
    remote = RemoteEngine(minilm, base_url=proxy_url, api_key=API_KEY, batch_size=8, max_retries=8, timeout=900)
    np.testing.assert_allclose(remote.embed(texts), local, atol=1e-5, rtol=0)
    np.testing.assert_allclose(remote.embed(["how do exceptions work?"], kind="query"), local_query, atol=1e-5)

    answered, failures, stop = [], [], threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                answered.append(np.abs(remote.embed(texts) - local).max())
            except Exception as exc:  # every request must be answered: any failure fails the test
                failures.append(exc)

    callers = [threading.Thread(target=load) for _ in range(3)]
    for caller in callers:
        caller.start()
    try:
        while len(answered) < 3 and not failures:
            time.sleep(0.1)
        victim, _ = started_replica()
        engine_processes = psutil.Process(victim["Pid"]).children(recursive=True)
        os.kill(victim["Pid"], signal.SIGKILL)  # a crash: requests in flight on it fail and are retried
        killed_at = len(answered)
        deadline = time.monotonic() + 900  # a failure bound only: the wait ends once six more calls are answered
        while len(answered) < killed_at + 6 and not failures and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for caller in callers:
            caller.join()
    remote.close()
    assert not failures, f"{len(failures)} calls failed, first: {failures[0]!r}"
    assert len(answered) > killed_at, "no call was answered after the replica was killed"
    assert max(answered) <= 1e-5
    # The dead replica's vLLM engine processes do not outlive it.
    _, alive = psutil.wait_procs(engine_processes, timeout=30)
    assert not alive, f"engine processes of the killed replica still run: {[p.pid for p in alive]}"


def test_the_replicas_bounds_are_the_servers_and_past_them_ray_answers_429(ray_cluster):
    deployment = pooling_app("m", limits={"max_concurrent_requests": 7}, device="cpu")._bound_deployment
    assert (deployment.max_ongoing_requests, deployment.max_queued_requests) == (7, 7)
    assert (deployment.backpressure_config.status_code, deployment.backpressure_config.retry_after_s) == (429, 1)
    unbounded = pooling_app("m", limits={"max_concurrent_requests": None}, device="cpu")._bound_deployment
    assert unbounded.max_queued_requests == -1, "an unbounded server leaves Ray's defaults"
    with pytest.raises(ValueError, match=r"^m: max_concurrent_requests=9 is over the server's"):
        pooling_app([{"model": "m", "max_concurrent_requests": 9}], limits={"max_concurrent_requests": 7})
    with pytest.raises(ValueError, match=r"^pooling_app takes its models as `model` or from `config`"):
        pooling_app("m", config="models.toml")


def started_replica(models: int = 2, deadline_s: float = 900) -> tuple[dict, list[psutil.Process]]:
    """A replica whose engines all run, with their engine-core processes (a replica Ray started to replace a killed
    one is alive before its engines are)."""
    deadline = time.monotonic() + deadline_s
    while True:
        for replica in replicas():
            children = psutil.Process(replica["Pid"]).children(recursive=True)
            cores = [p for p in children if "EngineCore" in " ".join(p.cmdline())]  # vLLM's process title
            if len(cores) == models:
                return replica, cores
        assert time.monotonic() < deadline, f"no replica with {models} engines within {deadline_s} s"
        time.sleep(1)


def test_a_replica_whose_engine_died_is_replaced_and_requests_succeed_afterwards(proxy_url, minilm, minilm_engine):
    """The engine core of one replica is killed (the replica's process lives on): its health check fails, Ray
    replaces it, and then every request is answered, none routed to a dead engine."""
    victim, cores = started_replica()
    for core in cores:
        core.kill()
    deadline = time.monotonic() + 900  # a failure bound only: the wait ends once Ray has replaced the replica
    while time.monotonic() < deadline:
        alive = replicas()
        if victim["ActorID"] not in {a["ActorID"] for a in alive} and len(alive) == 2:
            break
        time.sleep(1)
    assert victim["ActorID"] not in {a["ActorID"] for a in replicas()}, "the replica with a dead engine stayed"
    texts = passages()[:8]
    local = minilm_engine.embed(texts)
    body = {"model": str(minilm), "input": texts, "encoding_format": "float"}
    with httpx.Client(base_url=proxy_url, timeout=300, headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        while time.monotonic() < deadline and client.get("/health").status_code != 200:  # the replacement starts
            time.sleep(1)
        for _ in range(8):  # no retry: each request must reach a live engine
            answer = client.post("/v1/embeddings", json=body)
            assert answer.status_code == 200, answer.text
            vectors = [row["embedding"] for row in sorted(answer.json()["data"], key=lambda row: row["index"])]
            np.testing.assert_allclose(vectors, local, atol=1e-5, rtol=0)
