"""Start `rbln-retrieval serve` replicas on loopback ports for tests, and tear them down with SIGTERM; a server
outlives no test process (Linux's parent-death signal: SIGTERM, serve's own stop, when the test process dies by any
means, so a killed or interrupted run leaves no server or engine process behind)."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil

from rbln_retrieval.server.app import route_table

SERVE = (
    "import json, sys; from rbln_retrieval.server.serve import serve; "
    "sys.exit(serve(json.loads(sys.argv[1]), port=int(sys.argv[2]), device='cpu', **json.loads(sys.argv[3])))"
)


# Every route the server mounts besides the probes (its route table): the key guards each of them.
GUARDED = [(route.method, route.path) for route in route_table()]
PROBES = ["/health", "/ping", "/version", "/metrics"]


PR_SET_PDEATHSIG = 1
# Looked up here, not in the forked child, where the dynamic loader's lock may be held by a thread that did not fork.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl


def _stop_with_parent() -> None:
    """In the server's process before it runs serve: SIGTERM when the test process (the thread that started it, the
    pytest process's main thread) dies; serve stops its engine processes on it."""
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGTERM)


def outliving(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still running ``timeout`` s from now (a failure bound only), killed so that they leave
    nothing behind. An exited process counts as gone while it waits, a zombie, for a parent that may never reap it
    (an orphan's new parent, a container's first process)."""

    def running(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    while any(map(running, processes)) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = [process for process in processes if running(process)]
    for process in alive:
        process.kill()
    return alive


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(
        self,
        model: Path | str | list[Path],
        log: Path,
        api_key: str | None = None,
        env: dict[str, str] | None = None,
        options: dict | None = None,
        tls: tuple[Path, Path] | None = None,
        user_env: dict[str, str] | None = None,
    ):
        """A server of ``model`` on the CPU with ``options`` (serve()'s; default: float32), over HTTPS with ``tls``
        (certificate, key), which clients then verify against that certificate (``self.verify``). With
        ``user_env``: the command `rbln-retrieval serve MODEL --port P` as a user types it, in exactly that
        environment (nothing of this process's), with serve's defaults."""
        self.port = free_port()
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.verify: bool | str = str(tls[0]) if tls else True
        options = dict(options or {"dtype": "float32"})
        if tls:  # vLLM's own TLS options, passed through
            options["vllm_args"] = [
                *options.get("vllm_args", []),
                "--ssl-certfile",
                str(tls[0]),
                "--ssl-keyfile",
                str(tls[1]),
            ]
        self.log = log
        env = {**os.environ, **(env or {}), **({"RBLN_API_KEY": api_key} if api_key else {})}
        env.pop("RBLN_API_KEY", None) if api_key is None else None
        self._log_file = log.open("wb")
        served = [m if isinstance(m, dict) else str(m) for m in model] if isinstance(model, list) else str(model)
        command = [sys.executable, "-c", SERVE, json.dumps(served), str(self.port), json.dumps(options)]
        if user_env is not None:
            command, env = ["rbln-retrieval", "serve", str(model), "--port", str(self.port)], user_env
        self.process = subprocess.Popen(
            command,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_stop_with_parent,
        )

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"server on {self.url} not ready after {timeout} s")

    @contextmanager
    def stalled(self, resume: bool = True) -> Iterator[None]:
        """The engine stopped (SIGSTOP to every process under the API server: engine core and workers) and
        continued on exit (unless ``resume`` is false: a server killed inside stays dead): requests the server
        admits meanwhile hold their slots until then, deterministically."""
        engine = psutil.Process(self.process.pid).children(recursive=True)
        assert engine, "the server has no engine-core process"
        for process in engine:
            process.suspend()
        try:
            yield
        finally:
            for process in engine if resume else ():
                process.resume()

    def kill(self) -> None:
        """SIGKILL the whole process group (API server and engine core), as a crashed host would."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log_file.close()
        return self.process.returncode
