"""One engine per model and options across an app's processes (rbln_retrieval/frameworks/attach.py): four worker
processes of RBLNEmbeddings on one simulated NPU host share one engine by default (no opt-in variable), started
once, with equal vectors; the holder's death costs each of them one retried call; a holder that does not answer is
named in one sentence.

The NPU host is the user lane's (tests/npu_host: one device node; tests/standin: the stand-in compiler), with a
tiny BERT so that the holder's compile through the stand-in stays cheap. The workers and the holders are counted by
the suite's engine-start counter (tests/engine_count, chained by tests/npu_host/sitecustomize.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import reference
from npu import STANDIN
from tolerances import min_row_cosine

from langchain_rbln import RBLNEmbeddings
from rbln_retrieval import PoolingEngine, get_engine
from rbln_retrieval.engines.options import EngineOptions
from rbln_retrieval.frameworks import attach
from rbln_retrieval.frameworks.rendezvous import SHARE_ENV, EngineFiles

TEXTS = ["Paris is the capital of France.", "An NPU is a neural processing unit.", "Berlin is in Germany."]
WORKERS = 4
DEADLINE = 900.0  # seconds a worker may take to answer (an engine start on a loaded 2-core machine)
NPU_HOST = Path(__file__).resolve().parents[1] / "npu_host"

# A worker of an app: one RBLNEmbeddings with its defaults (device "auto": the NPU), a call per line on stdin, one
# JSON line back per call: the vectors, the holder's pid and the device and NPU its engine runs on.
WORKER = textwrap.dedent(
    """
    import json, os, sys
    from langchain_rbln import RBLNEmbeddings

    embeddings = RBLNEmbeddings(model=sys.argv[1])
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        vectors = embeddings.embed_documents(json.loads(line))
        engine = embeddings.engine.engine
        answer = {"vectors": vectors, "holder": engine.holder_pid, "device": engine.device}
        answer["npu"] = engine.stats()["npu"]
        print(json.dumps(answer), flush=True)
    embeddings.close()
    """
)


@pytest.fixture
def run_dir(tmp_path_factory, monkeypatch) -> Path:
    # A short path of its own: a Unix socket's address is at most 108 bytes.
    runtime = Path(tmp_path_factory.mktemp("run"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv(SHARE_ENV, "1")
    return runtime / "rbln-retrieval"


@pytest.fixture
def starts(tmp_path, monkeypatch) -> Iterator[Path]:
    """This test's own engine-start log for its processes, added to the suite's budget log afterwards."""
    log = tmp_path / "starts.log"
    suite_log = os.environ.get("RBLN_TEST_ENGINE_STARTS")
    monkeypatch.setenv("RBLN_TEST_ENGINE_STARTS", str(log))
    yield log
    if suite_log and log.exists():
        with open(suite_log, "a", encoding="utf-8") as out:
            out.write(log.read_text(encoding="utf-8"))


def _engine_starts(log: Path) -> int:
    return len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0


class Workers:
    """The app's worker processes, each answering one line per request."""

    def __init__(self, model: str, script: Path, count: int, env: dict[str, str]):
        self.processes = [
            subprocess.Popen(
                [sys.executable, str(script), model],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(count)
        ]
        self.pool = ThreadPoolExecutor(count)
        self.read_all()  # each has built its RBLNEmbeddings

    def read_all(self) -> list[dict]:
        lines = [self.pool.submit(process.stdout.readline) for process in self.processes]
        answers = [line.result(timeout=DEADLINE) for line in lines]
        assert all(answers), "a worker exited"
        return [json.loads(answer) for answer in answers]

    def embed_all(self, texts: list[str]) -> list[dict]:
        for process in self.processes:  # all at once: the holder serves them concurrently
            process.stdin.write(json.dumps(texts) + "\n")
            process.stdin.flush()
        return self.read_all()

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.stdin.close()
        for process in self.processes:
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
        self.pool.shutdown()


def _files(run_dir: Path) -> EngineFiles:
    (holder,) = run_dir.glob("*.holder")
    return EngineFiles(holder.with_suffix(""))


def _wait_until_gone(files: EngineFiles) -> None:
    deadline = time.monotonic() + DEADLINE
    while files.holder_alive():
        assert time.monotonic() < deadline, "the holder did not exit"
        time.sleep(0.2)


@pytest.fixture
def npu_host(tmp_path, run_dir, starts, monkeypatch) -> dict[str, str]:
    """The environment of a process on the simulated NPU host, sharing as it does by default there, its engine
    starts counted in this test's log."""
    monkeypatch.delenv(SHARE_ENV)
    paths = [str(STANDIN), str(NPU_HOST), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(paths),
        "REBEL_STANDIN_NPU": "RBLN-CA25",
        "RBLN_RETRIEVAL_CACHE_DIR": str(tmp_path / "compile-cache"),
    }


def test_four_workers_on_an_npu_share_one_engine_and_survive_its_holders_death(
    tiny_models, npu_host, run_dir, starts, tmp_path, monkeypatch
):
    path = tiny_models["bert-cls"]
    expected = reference.embed(str(path), TEXTS, pooling="CLS", max_length=512)
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    workers = Workers(str(path), script, WORKERS, npu_host)
    try:
        first = workers.embed_all(TEXTS)
        assert _engine_starts(starts) == 1, "four workers, one engine start"
        assert {(answer["device"], answer["npu"]) for answer in first} == {("rbln", "RBLN-CA25")}
        holder = {answer["holder"] for answer in first}
        assert len(holder) == 1, f"the workers attached to different holders: {holder}"
        vectors = np.asarray(first[0]["vectors"], dtype=np.float32)
        assert min_row_cosine(vectors, expected) >= 0.99999, "the NPU route's vectors against transformers'"
        for answer in first[1:]:
            np.testing.assert_array_equal(np.asarray(answer["vectors"], dtype=np.float32), vectors)
        files = _files(run_dir)

        # A holder that stops answering is named, with the fixes, once the wait for it runs out: a process of the
        # same user and options (here the test's own, on the host, opted in) asks for the engine.
        (pid,) = holder
        os.kill(pid, signal.SIGSTOP)
        try:
            monkeypatch.setenv(SHARE_ENV, "1")
            monkeypatch.setattr(attach, "ATTACH_TIMEOUT_SECONDS", 0.0)
            monkeypatch.setattr(attach, "PING_TIMEOUT_SECONDS", 0.5)
            with (
                pytest.raises(
                    RuntimeError, match=rf"held by process {pid} \(`\S*python\S* -m rbln_retrieval\.frameworks\.holder "
                ) as error,
                RBLNEmbeddings(model=str(path)) as embeddings,
            ):
                embeddings.embed_query(TEXTS[0])
            assert f"{SHARE_ENV}=0" in str(error.value) and "rbln-retrieval serve" in str(error.value)
        finally:
            os.kill(pid, signal.SIGCONT)

        # The holder dies: each worker's next call attaches again (one of them starts the next holder, which loads
        # the graphs the first compiled) and is answered, equal as before.
        os.kill(pid, signal.SIGKILL)
        _wait_until_gone(files)
        second = workers.embed_all(TEXTS)
        assert _engine_starts(starts) == 2, "one restart for the four workers"
        successor = {answer["holder"] for answer in second}
        assert len(successor) == 1 and successor != holder
        for answer in second:
            np.testing.assert_array_equal(np.asarray(answer["vectors"], dtype=np.float32), vectors)
    finally:
        workers.close()
    _wait_until_gone(files)  # the last worker gone, the holder exits by itself
    assert not files.socket.exists() and files.read_info() is None


def test_a_bad_model_is_refused_with_the_in_process_error_before_any_holder_starts(run_dir, tmp_path, cpu):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    with pytest.raises(Exception) as in_process:
        PoolingEngine(not_a_model, **cpu)
    with pytest.raises(type(in_process.value)) as attached:
        get_engine(not_a_model, **cpu)  # get_engine reads the family itself, in this process
    assert str(attached.value) == str(in_process.value)
    assert not list(run_dir.glob("*.holder")), "no holder was started for it"


def test_the_default_follows_the_device(monkeypatch):
    monkeypatch.delenv(SHARE_ENV, raising=False)
    assert attach.shares_across_processes(EngineOptions(device="rbln")), "opt-out on an NPU"
    assert not attach.shares_across_processes(EngineOptions(device="cpu")), "opt-in on the host"
    compile_only = {"additional_config": {"rbln_retrieval": {"compile_only": True}}}
    assert not attach.shares_across_processes(EngineOptions(device="rbln", engine_kwargs=compile_only))
    monkeypatch.setenv(SHARE_ENV, "0")
    assert not attach.shares_across_processes(EngineOptions(device="rbln"))
    monkeypatch.setenv(SHARE_ENV, "1")
    assert attach.shares_across_processes(EngineOptions(device="cpu"))
    monkeypatch.setenv(SHARE_ENV, "maybe")
    with pytest.raises(ValueError, match=f"{SHARE_ENV}='maybe' is not one of"):
        attach.shares_across_processes(EngineOptions())


def test_a_run_folder_too_deep_for_a_socket_address_still_gives_a_bindable_socket(tmp_path, monkeypatch):
    """A user's deep $HOME or $XDG_RUNTIME_DIR (the simulated NPU host's home in the user lane is one): the socket
    moves to a private folder in the temporary folder, the other files stay, and a listener binds it."""
    from multiprocessing.connection import Client, Listener

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    files = EngineFiles.for_key(("a model", "its options"))
    assert len(os.fsencode(files.path("sock"))) > 108, "the folder is not deep enough to test the fallback"
    assert files.socket.parent != files.stem.parent and files.path("json").parent == deep / "rbln-retrieval"
    assert oct(files.socket.parent.stat().st_mode & 0o777) == "0o700"
    files.socket.unlink(missing_ok=True)
    with Listener(str(files.socket), "AF_UNIX") as listener, Client(str(files.socket), "AF_UNIX") as client:
        with listener.accept() as served:
            client.send("ping")
            assert served.recv() == "ping"
