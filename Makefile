# The two commands a new machine needs are `make demo` and `make test`; both install into .venv first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TORCH_DEVICE_BACKEND_AUTOLOAD := 0

INSTALL_INPUTS := scripts/install.sh rbln_retrieval/install_cpu.py $(wildcard requirements/*.txt) pyproject.toml \
	integrations/langchain/pyproject.toml $(wildcard integrations/llama_index/*/pyproject.toml)

.PHONY: install demo lint format docs test test-serial test-fast test-ray test-avx2 bench bench-backend clean
install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	scripts/install.sh
	touch $(STAMP)

demo: install
	$(PY) examples/demo.py

# ruff (lint and format) over the repository; mypy, strict on rbln_retrieval/ outside the vLLM boundary (pyproject).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# The docs site (mkdocs.yml, docs/) into site/: warnings, broken internal links and anchors fail the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The suite on PYTEST_WORKERS pytest-xdist workers (tests/workers.py: a file, or the files sharing a session server
# or a Ray cluster, per worker, the longest first); PYTEST_WORKERS=0, or `make test-serial`, runs it in one process.
# PYTEST_ARGS go to pytest in both (e.g. "--timeline=run.jsonl", read by bench/suite_timeline.py).
PYTEST_WORKERS ?= 2
WORKERS := -n $(PYTEST_WORKERS) --dist loadfile

test: install
	$(PY) -m pytest $(WORKERS) $(PYTEST_ARGS)

test-serial: install
	$(PY) -m pytest $(PYTEST_ARGS)

# A developer's loop, about 2 minutes: pinned imports, unit tests, input checks and the MiniLM engine's own
# behaviour; no servers, no Ray, no examples (those run in `make test`).
test-fast: install
	$(PY) -m pytest -m "not ray and not server and not slow" tests/project/test_imports.py tests/engine/test_cpu_features.py \
		tests/backend/test_units.py tests/engine/test_bad_input.py tests/engine/test_minilm.py integrations/langchain/tests/unit_tests

# Only the Ray group (a local Ray cluster: bulk embedding on Ray Data, replicas on Ray Serve).
test-ray: install
	$(PY) -m pytest -m ray

# The suite as an AVX2-only CPU runs it, on a machine with AVX-512 (docs/development.md, "CPU classes").
test-avx2: install
	ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest $(WORKERS)

bench: install
	$(PY) bench/run.py
	$(PY) bench/step_flops.py
	$(PY) bench/seed_side_by_side.py
	$(PY) bench/first_vector.py

bench-backend: install
	$(PY) bench/backend.py

clean:
	rm -rf $(VENV) .demo-data
