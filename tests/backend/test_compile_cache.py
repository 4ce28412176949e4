"""The compile cache under concurrent writers and crashes, against the stand-in compiler (tests/standin) on the
ahead-of-time route (RBLN-CA25: one .rbln file per bucket graph): two processes compiling one key at once both start
and only one compiles (the other waits on the key's lock and loads its graphs); a manifest a crash left half written
is a miss, rebuilt with one warning, not a JSONDecodeError at every start; a cache root other users may write is
refused in one sentence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from npu import STANDIN

from rbln_retrieval.backend.npu import artifacts
from rbln_retrieval.backend.npu.artifacts import ArtifactMismatchError

# A compile-only build of one small bucket graph, as `rbln-retrieval compile` makes it; prints the cache's stats.
COMPILE = textwrap.dedent(
    """
    import json, sys
    from rbln_retrieval import PoolingEngine

    settings = {"compile_only": True, "npu": "RBLN-CA25", "shapes": [[1, 64]]}
    options = {"additional_config": {"rbln_retrieval": settings}}
    with PoolingEngine(sys.argv[1], device="rbln", dtype="float32", max_length=64, engine_kwargs=options) as engine:
        print(json.dumps(engine.stats()["compile_cache"]))
    """
)


def compile_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RBLN_FORCE_NPU_NAME", "RBLN_TARGET_SOC")}
    pythonpath = [str(STANDIN), *filter(None, [env.get("PYTHONPATH")])]
    return env | {
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "RBLN_RETRIEVAL_CACHE_DIR": str(root),
        "REBEL_STANDIN_NPU": "",
    }


def start(model: Path, root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", COMPILE, str(model)],
        env=compile_env(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[dict, str]:
    out, err = process.communicate(timeout=1200)  # a failure bound on a loaded machine, not a wait
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


@pytest.fixture(scope="module")
def shared_root(tiny_models, tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    """Two processes that compile one model into one cache root at once: (model, root, their cache stats)."""
    root = tmp_path_factory.mktemp("shared-cache")
    model = tiny_models["bert-cls"]
    both = [start(model, root), start(model, root)]
    return model, root, [finish(p)[0] for p in both]


def test_two_processes_compiling_one_key_both_start_and_one_compiles(shared_root):
    _, root, stats = shared_root
    assert stats[0]["dir"] == stats[1]["dir"], "one key"
    compiled = sorted(s["artifacts_compiled"] for s in stats)
    assert compiled == [0, 1], f"the second process waited and loaded the first one's graph: {stats}"
    assert sorted(s["artifacts_loaded"] for s in stats) == [0, 1]
    cache = Path(stats[0]["dir"])
    assert len(json.loads((cache / artifacts.MANIFEST).read_text())["graphs"]) == 1
    assert not [p for p in root.rglob("*.tmp")], "no temporary file is left behind"


def test_a_truncated_manifest_is_rebuilt_with_one_warning(shared_root):
    model, root, stats = shared_root
    manifest = Path(stats[0]["dir"]) / artifacts.MANIFEST
    manifest.write_bytes(manifest.read_bytes()[: len(manifest.read_bytes()) // 2])  # a crash mid-write
    again, err = finish(start(model, root))
    assert again["dir"] == stats[0]["dir"] and again["artifacts_loaded"] == 1
    assert len(json.loads(manifest.read_text())["graphs"]) == 1, "the manifest was written again, whole"
    assert err.count("is unreadable") == 1, err[-3000:]


def test_a_cache_root_other_users_may_write_is_refused_in_one_sentence(tmp_path, caplog):
    root = tmp_path / "cache"
    key = root / "bert-0123456789abcdef"
    key.mkdir(parents=True)
    pins = {"npu": "RBLN-CA25", "family": "ATOM", "sdk": "0.0", "snapshot": "s"}
    assert not artifacts.check(key, pins, model="m", rebuild=False), "an empty key: a miss"
    root.chmod(0o1777)  # world-writable with the sticky bit (as /tmp): others cannot replace what is ours
    assert not artifacts.check(key, pins, model="m", rebuild=False)
    for path, mode in ((root, 0o777), (key, 0o775)):
        path.chmod(mode)
        with pytest.raises(ArtifactMismatchError) as refused:
            artifacts.check(key, pins, model="m", rebuild=False)
        message = str(refused.value)
        assert message.startswith(f"The compile cache at {path} is refused because its mode ") and "\n" not in message
        assert message.count(". ") == 0 and "set RBLN_RETRIEVAL_CACHE_DIR" in message
        path.chmod(0o755)
    if os.geteuid() == 0:  # only root can give a directory away
        os.chown(key, 4321, -1)
        with pytest.raises(ArtifactMismatchError, match=r"because it belongs to user id 4321, not to this process's 0"):
            artifacts.check(key, pins, model="m", rebuild=False)


def test_torn_json_in_the_cache_is_a_miss_with_one_warning(tmp_path, caplog):
    hashes = tmp_path / artifacts.CONTENT_HASHES
    hashes.write_text('{"/m/model.safetensors": {"stat": [1, 2')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    first = artifacts.snapshot_fingerprint(tmp_path / "model", hashes)
    assert first == artifacts.snapshot_fingerprint(tmp_path / "model", None)
    assert json.loads(hashes.read_text()), "the table was rebuilt"
    warned = [r.getMessage() for r in caplog.records if "is unreadable" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"The compile cache's {hashes} is unreadable (JSONDecodeError: ")


def test_the_compile_lock_excludes_other_processes_and_never_waits_on_its_own(tmp_path):
    key = tmp_path / "root" / "bert-0123456789abcdef"
    lock = artifacts.compile_lock(key)
    assert lock is not None and artifacts.compile_lock(key) is None, "held here: not waited on again"
    probe = "import fcntl, sys; f = open(sys.argv[1], 'ab'); fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)"
    other = subprocess.run([sys.executable, "-c", probe, f"{key}.lock"], capture_output=True, text=True)
    assert other.returncode != 0 and "BlockingIOError" in other.stderr, "another process cannot take it"
    lock.close()
    assert subprocess.run([sys.executable, "-c", probe, f"{key}.lock"]).returncode == 0, "released"
    again = artifacts.compile_lock(key)
    assert again is not None
    again.close()
