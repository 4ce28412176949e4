# The two commands a new machine needs are `make demo` and `make test`; both install into .venv first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TORCH_DEVICE_BACKEND_AUTOLOAD := 0

INSTALL_INPUTS := scripts/install.sh scripts/vllm_requirements.py $(wildcard requirements/*.txt) pyproject.toml \
	integrations/langchain/pyproject.toml $(wildcard integrations/llama_index/*/pyproject.toml)

.PHONY: install demo test test-ray test-avx2 bench bench-backend clean
install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	scripts/install.sh
	touch $(STAMP)

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest

# Only the Ray group (a local Ray cluster: bulk embedding on Ray Data, replicas on Ray Serve).
test-ray: install
	$(PY) -m pytest -m ray

# The suite as an AVX2-only CPU runs it, on a machine with AVX-512 (see README, "Tests").
test-avx2: install
	ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 $(PY) -m pytest

bench: install
	$(PY) bench/run.py

bench-backend: install
	$(PY) bench/backend.py

clean:
	rm -rf $(VENV) .demo-data
