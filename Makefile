# Quick start: `make demo` and `make test`. Both create .venv at the repo root if needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean install

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch==2.13.0 is the CPU build from this machine's disk; pip (not uv) finds it.
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gradsan demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks tools examples

test: $(STAMP) lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -p no:cacheprovider tests

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_jax_guard.py

clean:
	rm -rf $(VENV)
