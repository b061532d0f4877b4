# Quick start: `make demo` and `make test`. Both create .venv at the repo root if needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
PYTEST := $(BIN)/python -m pytest -q -p no:cacheprovider
LINTED := src tests benchmarks tools examples
# The public modules whose docstrings carry `>>>` examples.
DOCTESTED := src/gradsan/jax/safe.py src/gradsan/torch/safe.py

.PHONY: demo test test-fast lint doctest bench bench-full docs clean install

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch==2.13.0 is the CPU build from this machine's disk; pip (not uv) finds it.
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# benchmarks/bench_sanitize.py trains on scikit-learn's digits: the bench extra.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/gradsan demo

lint: $(STAMP)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy

# All of it, the `slow` tests included: what CI runs (.ci/run). The doctests of $(DOCTESTED) run
# inside the suite (tests/core/test_doctests.py), in its workers: no second pytest process.
test: $(STAMP) lint
	$(PYTEST) -n 2 --dist loadfile tests

# The suite without the `slow` tests (torch.compile, subprocess runs, linalg certify, the big
# fuzz): for the edit-test loop, not a substitute for `make test`.
test-fast: $(STAMP)
	$(PYTEST) -n 2 --dist loadfile -m "not slow" tests

doctest: $(STAMP)
	$(PYTEST) --doctest-modules $(DOCTESTED)

# Every benchmark in its quick mode (minutes); `make bench-full` for the numbers in the README.
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench_jax.py --quick
	$(BIN)/python benchmarks/bench_torch.py --quick
	$(BIN)/python benchmarks/bench_nansafe.py --quick
	$(BIN)/python benchmarks/bench_safe.py 11 --n 1000000
	$(BIN)/python benchmarks/bench_certify.py --repeat 3
	$(BIN)/python benchmarks/bench_sanitize.py --epochs 1
	$(BIN)/python benchmarks/bench_mesh.py --rounds 10

bench-full: $(BENCH_STAMP)
	$(BIN)/python benchmarks/bench_jax.py
	$(BIN)/python benchmarks/bench_torch.py
	$(BIN)/python benchmarks/bench_nansafe.py
	$(BIN)/python benchmarks/bench_safe.py 61
	$(BIN)/python benchmarks/bench_certify.py
	$(BIN)/python benchmarks/bench_sanitize.py
	$(BIN)/python benchmarks/bench_mesh.py

# The generated documents: docs/catalog.md from the catalog, docs/conventions.md by measuring
# both frameworks (`--check` on either script tells whether the committed file is current).
docs: $(STAMP)
	$(BIN)/python tools/gen_catalog_doc.py
	$(BIN)/python tools/gen_conventions.py

clean:
	rm -rf $(VENV)
