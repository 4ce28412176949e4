#!/usr/bin/env bash
# Build the four distributions (an sdist, then a wheel from that sdist, each) into dist/ and check them with twine;
# .ci/run runs it. Builds are isolated: pip fetches each project's build backend (setuptools, hatchling) from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
rm -rf dist
for project in . integrations/langchain integrations/llama_index/embeddings integrations/llama_index/postprocessor; do
    "$PY" -m build --outdir dist "$project" > "$LOG" 2>&1 || { cat "$LOG" >&2; exit 1; }
done
"$PY" -m twine check --strict dist/*
