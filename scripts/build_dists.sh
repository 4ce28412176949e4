#!/usr/bin/env bash
# Build the four distributions (an sdist, then a wheel from that sdist, each) into dist/ and check them with twine;
# .ci/run runs it; tests/user_lane/test_wheel_install.py builds into a folder of its own (DIST). Builds are isolated: pip
# fetches each project's build backend (setuptools, hatchling) from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DIST=${DIST:-dist}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
rm -rf "$DIST"
for project in . integrations/langchain integrations/llama_index/embeddings integrations/llama_index/postprocessor; do
    "$PY" -m build --outdir "$DIST" "$project" > "$LOG" 2>&1 || { cat "$LOG" >&2; exit 1; }
done
"$PY" -m twine check --strict "$DIST"/*
