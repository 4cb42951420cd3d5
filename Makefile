# The two commands a fresh clone needs (README): `make demo` and `make test`.
# Each creates .venv when missing and installs everything from this repository's own files.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jenga-install-stamp
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install demo test lint typecheck check clean tiny-model e2e-cpu

install: $(STAMP)

$(STAMP): pyproject.toml scripts/install-cpu.sh
	bash scripts/install-cpu.sh

demo: install
	$(PY) -m jenga_sglang.bench.demo

test: install
	$(PY) -m pytest -q -p no:cacheprovider

# A tiny NemotronH (random weights, locally trained tokenizer) for serving on CPU (docs/e2e-cpu.md).
tiny-model: data/tiny-model/model.safetensors

data/tiny-model/model.safetensors: scripts/make_tiny_model.py | $(STAMP)
	$(PY) scripts/make_tiny_model.py --out data/tiny-model

# Serve the tiny model with SGLang on CPU, stock and with --enable-jenga; one JSON summary
# (docs/e2e-cpu.md). About 10 minutes on 2 cores.
e2e-cpu: tiny-model
	$(PY) -m jenga_sglang.bench.e2e_cpu --model data/tiny-model --out out/e2e

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
