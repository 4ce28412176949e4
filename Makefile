# The two commands a new machine needs are `make demo` and `make test`; both install into .venv first.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TORCH_DEVICE_BACKEND_AUTOLOAD := 0

INSTALL_INPUTS := scripts/install.sh scripts/vllm_requirements.py $(wildcard requirements/*.txt) pyproject.toml \
	integrations/langchain/pyproject.toml $(wildcard integrations/llama_index/*/pyproject.toml)

.PHONY: install demo test bench bench-backend clean
install: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	scripts/install.sh
	touch $(STAMP)

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest

bench: install
	$(PY) bench/run.py

bench-backend: install
	$(PY) bench/backend.py

clean:
	rm -rf $(VENV) .demo-data
