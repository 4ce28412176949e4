"""Faults: the engine process killed mid-ingest, an in-process step that fails, engines that cannot start, cancelled
and interrupted calls (in-process and with vLLM's engine processes), and remote servers that refuse, stall, fail or
answer garbage. Each ends in one clear error or a usable engine."""

from __future__ import annotations

import asyncio
import gc
import json
import multiprocessing
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest
from corpus import mixed_length
from http_fakes import FakeServer
from servers import free_port, outliving

from rbln_retrieval import EngineDeadError, EngineStartError, ModelNotSupportedError, PoolingEngine
from rbln_retrieval.remote import RemoteEngine, RemoteError

INGEST = [f"passage {i}: " + "words to keep the engine busy " * 20 for i in range(20_000)]
DEAD = "died while serving this call; the next call starts a new one."


@pytest.fixture(scope="module", params=["in-process", "engine-processes"])
def any_engine(request, minilm, minilm_engine) -> PoolingEngine:
    """The shared MiniLM engine in each mode: vLLM inside this process, or in its own engine processes."""
    if request.param == "in-process":
        return minilm_engine
    return PoolingEngine.shared(minilm, device="cpu", dtype="float32", in_process=False)


def engine_processes() -> list[psutil.Process]:
    """vLLM's processes (engine core and its workers) below this test process."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name().startswith("VLLM"):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def assert_no_new_engine_processes(before: list[psutil.Process], timeout: float = 30) -> None:
    new = [p for p in engine_processes() if p not in before]
    _, alive = psutil.wait_procs(new, timeout=timeout)
    assert not alive, f"engine processes left behind: {alive}"


def wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def unfinished(engine: PoolingEngine) -> int:
    """Requests vLLM's front end still tracks for this engine (waiting or computing)."""
    return engine._vllm.get_num_unfinished_requests()


def assert_engine_idle(engine: PoolingEngine) -> None:
    """No request left in the front end, and the runner takes no step over a quiet second."""
    wait_until(lambda: unfinished(engine) == 0, 30, "the cancelled requests are gone")
    steps = engine.stats()["steps"]
    time.sleep(1.0)
    assert engine.stats()["steps"] == steps, "the engine kept computing after the call was abandoned"


# -- the engine process dies ---------------------------------------------------------------------------------------
def test_killed_engine_process_fails_the_call_fast_and_the_next_call_restarts(minilm, minilm_engine):
    texts = mixed_length(40)
    expected = minilm_engine.embed(texts)
    before = [p for p in engine_processes()]
    engine = PoolingEngine(minilm, device="cpu", dtype="float32", in_process=False)  # a process to kill
    try:
        (core,) = [p for p in engine_processes() if p not in before and p.name() == "VLLM::EngineCore"]
        outcome: dict[str, object] = {}

        def ingest() -> None:
            try:
                outcome["result"] = engine.embed(INGEST)
            except BaseException as exc:
                outcome["error"], outcome["at"] = exc, time.monotonic()

        worker = threading.Thread(target=ingest, daemon=True)
        worker.start()
        wait_until(lambda: unfinished(engine) > 100, 120, "the ingest is in flight")
        killed_at = time.monotonic()
        core.send_signal(signal.SIGKILL)
        # Fast means without waiting out the ingest or a timeout: bounded by the join, never by a timing assert.
        worker.join(timeout=60)
        assert not worker.is_alive(), "the in-flight call hung after the engine process died"
        error = outcome.get("error")
        assert isinstance(error, EngineDeadError), f"expected EngineDeadError, got {error!r}"
        assert str(error).endswith(DEAD)
        print(f"\nengine killed: the call failed after {outcome['at'] - killed_at:.2f} s")

        np.testing.assert_allclose(engine.embed(texts), expected, atol=1e-5)
        (new_core,) = [p for p in engine_processes() if p not in before and p.name() == "VLLM::EngineCore"]
        assert new_core.pid != core.pid
    finally:
        engine.close()
    assert_no_new_engine_processes(before)


KILLED_WITH_ITS_ENGINE_OPEN = """
import sys, time
from rbln_retrieval import PoolingEngine

if __name__ == "__main__":
    engine = PoolingEngine(sys.argv[1], device="cpu", dtype="float32", in_process=False)
    engine.embed(["hello"])
    print("ready", flush=True)
    time.sleep(600)
"""


def test_the_engine_process_ends_when_the_program_that_started_it_is_killed(minilm, tmp_path):
    # vLLM's engine core watches nothing above it: a program killed by SIGKILL (the OOM killer, a Ray actor
    # killed, a crashed notebook kernel) left it running with its memory (on an NPU, its device) for good.
    script = tmp_path / "program.py"
    script.write_text(KILLED_WITH_ITS_ENGINE_OPEN)
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        program = subprocess.Popen([sys.executable, str(script), str(minilm)], stdout=subprocess.PIPE, stderr=stderr)
    try:
        assert program.stdout.readline() == b"ready\n", log.read_text()[-2000:]
        engine = psutil.Process(program.pid).children(recursive=True)
        assert "VLLM::EngineCore" in [p.name() for p in engine], engine
    finally:
        program.kill()
        program.wait()
    assert not outliving(engine, timeout=120), "the engine process outlived the program that started it"
    assert "has exited without closing it; stopping." in log.read_text()


def test_failed_in_process_step_fails_every_pending_call_and_the_next_call_restarts(minilm_engine, monkeypatch):
    texts = mixed_length(40)
    expected = minilm_engine.embed(texts)
    dead = minilm_engine._vllm
    runner = dead._engine.model_executor.driver_worker.worker.model_runner
    outcomes: list[BaseException | np.ndarray] = []

    def ingest(part: list[str]) -> None:
        try:
            outcomes.append(minilm_engine.embed(part))
        except BaseException as exc:
            outcomes.append(exc)

    callers = [threading.Thread(target=ingest, args=(INGEST[k * 500 : (k + 1) * 500],), daemon=True) for k in range(3)]
    for caller in callers:
        caller.start()
    wait_until(lambda: unfinished(minilm_engine) > 1000, 120, "three ingests are in flight")

    def broken_step(*args, **kwargs):
        raise RuntimeError("injected fault in the model runner")

    monkeypatch.setattr(runner, "execute_model", broken_step)
    for caller in callers:
        caller.join(timeout=60)
        assert not caller.is_alive(), "a pending call hung after its step failed"
    assert len(outcomes) == 3
    for outcome in outcomes:
        assert isinstance(outcome, EngineDeadError), f"expected EngineDeadError, got {outcome!r}"
        assert str(outcome).endswith(DEAD)
        assert "injected fault" in str(outcome.__cause__.__cause__)
    assert dead.errored

    np.testing.assert_allclose(minilm_engine.embed(texts), expected, atol=1e-5)
    assert minilm_engine._vllm is not dead and not minilm_engine._vllm.errored
    assert minilm_engine.stats()["steps"] >= 1


# -- the engine cannot start ---------------------------------------------------------------------------------------
def test_corrupt_weights_file_is_a_clear_error_and_leaves_no_process(tiny_models, tmp_path):
    model = tmp_path / "corrupt"
    shutil.copytree(tiny_models["bert-cls"], model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = engine_processes()
    with pytest.raises(EngineStartError, match=r"model\.safetensors is not a readable safetensors file \(.+\)\.$"):
        PoolingEngine(model, device="cpu", dtype="float32")
    assert_no_new_engine_processes(before)
    assert gc.get_freeze_count() == 0  # the start froze the heap to speed vLLM's collections; a failure thaws it


def test_unsupported_architecture_is_refused_before_any_process_starts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["T5ForConditionalGeneration"]}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    before = engine_processes()
    with pytest.raises(ModelNotSupportedError, match="architecture 'T5ForConditionalGeneration'"):
        PoolingEngine(tmp_path, device="cpu")
    assert engine_processes() == before


def test_engine_processes_in_a_daemonic_process_are_refused_in_one_sentence(minilm, monkeypatch):
    # A multiprocessing Pool worker is daemonic: it may not have children, so only an in-process engine runs there.
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)
    before = engine_processes()
    with pytest.raises(
        EngineStartError,
        match=r"daemonic process \(a multiprocessing Pool worker\) cannot start; "
        r"use in_process=True there\.$",
    ):
        PoolingEngine(minilm, device="cpu", dtype="float32", in_process=False)
    assert engine_processes() == before


FIRST_ENGINE_OF_A_PROCESS = """
import gc, sys, weakref
from rbln_retrieval import PoolingEngine

if __name__ == "__main__":
    engine = PoolingEngine(sys.argv[1], device="cpu", dtype="float32", in_process=False)
    engine.embed(["hello"])
    client = weakref.ref(engine._vllm)
    engine.close()
    del engine
    gc.collect()
    print("client alive" if client() is not None else "client freed")
"""


def run_script(directory, source: str, *args) -> subprocess.CompletedProcess:
    """``source`` run as a program of its own (a fresh interpreter: vLLM's once-per-process state is unset)."""
    script = directory / "program.py"
    script.write_text(source)
    command = [sys.executable, str(script), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=directory)


def test_a_closed_engine_is_freed_even_when_vllm_was_first_imported_during_its_start(minilm, tmp_path):
    # vLLM keeps an import error's traceback for good, which held the frames of the start that first imported it
    # (the AsyncLLM among their locals); the AsyncLLM's __del__ then failed at interpreter exit.
    result = run_script(tmp_path, FIRST_ENGINE_OF_A_PROCESS, minilm)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "client freed"
    assert "Exception ignored" not in result.stderr, result.stderr[-2000:]


LEFT_OPEN_WITH_ITS_STDOUT_CLOSED = """
import os, sys
from rbln_retrieval import PoolingEngine

if __name__ == "__main__":
    os.environ["VLLM_LOGGING_LEVEL"] = "INFO"  # a user who asked for vLLM's logs (the suite's backend tests get INFO)
    captured = open(sys.argv[2], "w")
    sys.stdout = captured  # as pytest's capture does, and closes before the interpreter's exit hooks run
    engine = PoolingEngine(sys.argv[1], in_process=False)  # the engine-process client logs its shutdown
    engine.embed(["one text"])
    captured.close()
"""


def test_an_engine_left_open_closes_at_exit_without_logging_errors(minilm, tmp_path):
    # vLLM logs its shutdown through a handler bound to the stdout of its import; writing to a closed stream
    # printed a "Logging error" traceback per message after the program's (and CI's) last line.
    before = engine_processes()
    result = run_script(tmp_path, LEFT_OPEN_WITH_ITS_STDOUT_CLOSED, minilm, tmp_path / "stdout.txt")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Logging error" not in result.stderr, result.stderr[-2000:]
    assert_no_new_engine_processes(before)


STARTED_UNDER_A_REDIRECTED_STDOUT = """
import contextlib, io, sys
from rbln_retrieval import PoolingEngine

if __name__ == "__main__":
    buffer, stdout = io.StringIO(), sys.stdout
    with contextlib.redirect_stdout(buffer):  # no file descriptor behind it, as under pytest's capsys
        engine = PoolingEngine(sys.argv[1], in_process=True, dtype="float32")
        vector = engine.embed(["one text"])
        print("printed inside")
        assert sys.stdout is buffer
    engine.close()
    assert sys.stdout is stdout and buffer.getvalue() == "printed inside\\n", repr(buffer.getvalue())
    print("started", vector.shape)
"""


def test_an_in_process_engine_starts_while_the_program_redirects_stdout_to_a_string(minilm, tmp_path):
    # vLLM silences C libraries while it builds its process groups by redirecting sys.stdout.fileno(); a program
    # whose stdout was a StringIO could not start an engine ("vLLM could not start an engine ...: fileno"). A fresh
    # process: vLLM builds its process groups once per process.
    result = run_script(tmp_path, STARTED_UNDER_A_REDIRECTED_STDOUT, minilm)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "started (1, 384)"


# -- the caller gives up -------------------------------------------------------------------------------------------
async def test_cancelled_async_call_aborts_its_requests(any_engine):
    expected = any_engine.embed(INGEST[:8])
    call = asyncio.create_task(any_engine.aembed(INGEST))
    await asyncio.to_thread(wait_until, lambda: unfinished(any_engine) > 100, 120, "the ingest is in flight")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.to_thread(assert_engine_idle, any_engine)
    np.testing.assert_allclose(await any_engine.aembed(INGEST[:8]), expected, atol=1e-5)


def test_keyboard_interrupt_during_a_sync_ingest_leaves_the_engine_usable(any_engine):
    expected = any_engine.embed(INGEST[:8])
    # Ctrl-C as a program sees it: Python's own handler. Earlier tests of this session leave SIGINT ignored in the
    # test process (seen with gdb: SIG_IGN after the engine tests), which would turn the interrupt into nothing.
    previous_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter_failed: list[BaseException] = []

    def interrupt() -> None:
        try:
            wait_until(lambda: unfinished(any_engine) > 100, 120, "the ingest is in flight")
        except BaseException as exc:  # surfaces below instead of letting the whole ingest run
            interrupter_failed.append(exc)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # what Ctrl-C does

    interrupter = threading.Thread(target=interrupt, daemon=True)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            any_engine.embed(INGEST)
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    interrupter.join()
    assert not interrupter_failed, interrupter_failed
    assert_engine_idle(any_engine)
    np.testing.assert_allclose(any_engine.embed(INGEST[:8]), expected, atol=1e-5)


# -- remote servers misbehave --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, message", [("500", r"answered HTTP 500"), ("garbage", r"answered with malformed JSON")])
def test_remote_failures_map_to_one_error_after_bounded_retries_with_backoff(minilm, mode, message):
    with FakeServer(mode) as server, RemoteEngine(minilm, base_url=server.url, max_retries=3) as remote:
        with pytest.raises(RemoteError, match=rf"/v1/embeddings failed after 4 attempts; last: .*{message}\.$"):
            remote.embed(["a", "b"])
    assert len(server.posts) == 4  # bounded by attempts, not by time
    # Backoff doubles from 0.25 s with +-50% jitter.
    for attempt, gap in enumerate(server.gaps()):
        assert gap >= 0.25 * 2**attempt * 0.5, f"retry {attempt + 1} came after only {gap:.2f} s"


def test_a_remote_timeout_bounds_the_whole_call_not_each_attempt(minilm):
    with (
        FakeServer("sleep", delay=8.0) as server,
        RemoteEngine(minilm, base_url=server.url, max_retries=3, timeout=2) as remote,
    ):
        with pytest.raises(RemoteError) as failure:
            remote.embed(["a", "b"])
    assert str(failure.value) == (
        f"/v1/embeddings got no answer within the call's timeout of 2 s (1 attempt); last: {server.url} timed out "
        "after 2 s (the call's timeout)."
    )
    assert len(server.posts) == 1, "a retry never starts past the call's deadline"


def test_remote_connection_refused_maps_to_one_error_after_bounded_retries(minilm):
    with RemoteEngine(minilm, base_url=f"http://127.0.0.1:{free_port()}", max_retries=2) as remote:
        started = time.monotonic()
        with pytest.raises(RemoteError, match=r"failed after 3 attempts; last: could not reach .*ConnectError"):
            remote.embed(["x"])
        assert time.monotonic() - started >= 0.25 * 0.5 + 0.5 * 0.5  # it backed off between the attempts


def test_remote_json_of_the_wrong_shape_is_a_clear_error_at_once(minilm):
    with FakeServer("wrong-shape") as server, RemoteEngine(minilm, base_url=server.url, max_retries=3) as remote:
        with pytest.raises(RemoteError, match=r"answered JSON without a list of results in 'data', so its answer is"):
            remote.embed(["a"])
    assert len(server.posts) == 1, "a well-formed answer of the wrong shape is not retried"
