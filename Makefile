# The README's two commands: `make run` and `make test`. Each creates .venv and installs what it
# needs first (idempotent; a stamp file skips reinstalls until pyproject.toml changes).
#
# Bring your own torch: `make run TORCH_SPEC="torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124"`
# or reuse an environment that already has it: `make run VENV_FLAGS=--system-site-packages TORCH_SPEC=`.

PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
BIN := $(VENV)/bin
LINT_DIRS := $(wildcard trak_dist tests benchmarks launch)

.PHONY: install install-test run test test-fast lint typecheck cuda bench dist wheel-check clean \
	device-wheels device-dry-run docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q $(TORCH_SPEC); fi
	$(BIN)/python -m pip install -q -e ".[plot]"  # the report's picture of the digits default
	@touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q $(TORCH_SPEC); fi
	$(BIN)/python -m pip install -q -e ".[test]"
	@touch $@ $(VENV)/.installed-run

# the docs site's tools (the `docs` extra: MkDocs Material, mkdocstrings), with torch pinned as above
$(VENV)/.installed-docs: pyproject.toml | $(BIN)/python
	@if [ -n "$(TORCH_SPEC)" ]; then $(BIN)/python -m pip install -q $(TORCH_SPEC); fi
	$(BIN)/python -m pip install -q -e ".[docs]"
	@touch $@

install: $(VENV)/.installed-run
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/trak-dist

test: install-test lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the edit loop: no lint, no slow/slurm/gpu tests, stop at the first failure, name the slowest
# ten (`make test` and CI run everything)
FAST_MARKERS ?= not slow and not slurm and not gpu
test-fast: install-test
	$(BIN)/python -m pytest -x -q -m "$(FAST_MARKERS)" --durations=10 $(PYTEST_ARGS)

lint: install-test
	$(BIN)/ruff check $(LINT_DIRS)
	$(BIN)/ruff format --check $(LINT_DIRS)
	$(BIN)/mypy

# the docs site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing page or anchor,
# or a page left out of the nav fails it
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict --site-dir site

cuda:
	$(MAKE) -C cuda_ext

# what a lent GPU machine lacks, in .device/gpu (it travels: benchmarks/device_check.sh, docs in
# cuda_ext/README.md), and the same set for this Python in .device/dryrun
device-wheels: install-test
	PY=$(BIN)/python bash benchmarks/device_wheels.sh

# the GPU check's every section at tiny sizes on this CPU, as it would run there (CI)
DRY_RUN_OUT ?= .device/dry-run
device-dry-run: device-wheels
	bash benchmarks/device_check.sh --cpu-dry-run $(DRY_RUN_OUT)

bench: install-test
	$(BIN)/python -m benchmarks

# the sdist and the wheel (built from the sdist) in dist/
dist: install-test
	$(BIN)/python -m build --outdir dist .

# the wheel installed into a fresh venv outside the checkout and run from an empty directory (CI)
wheel-check: install-test
	PYTHON=$(PYTHON) TORCH_SPEC="$(TORCH_SPEC)" bash .ci/wheel-check.sh

clean:
	rm -rf $(VENV) build dist *.egg-info cuda_ext/build .device site
