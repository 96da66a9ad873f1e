# Two commands do all the set-up on a fresh machine with python3, pip and make:
#   make table   -- virtual environment, install, print the derivation's comparison table
#   make test    -- virtual environment with the dev extra, run the test suite
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# PyTorch's CPU wheels (https://pytorch.org/get-started/locally/, "CPU"): without this index pip
# takes torch from PyPI, whose Linux wheel is the CUDA build (several GB). A torch==2.13.0 that pip
# finds without any index (already installed, or a local wheel that pip's configuration points
# at) is used as it is, its own dependencies from PyPI when they are not local too. For the CUDA
# build: make test TORCH_INDEX=https://pypi.org/simple
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH      := torch==2.13.0

.PHONY: table test test-slow lint format bench clean baselines docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-index '$(TORCH)' 2>/dev/null \
	  || ( $(BIN)/python -m pip download --quiet --no-index --no-deps '$(TORCH)' -d $(VENV)/torch-wheel 2>/dev/null \
	       && $(BIN)/python -m pip install --quiet $(VENV)/torch-wheel/torch-*.whl && rm -rf $(VENV)/torch-wheel ) \
	  || $(BIN)/python -m pip install --quiet '$(TORCH)' --index-url $(TORCH_INDEX)
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/.torch
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

table: $(VENV)/.installed
	$(BIN)/variance-lab table

test: $(VENV)/.installed-dev
	$(BIN)/python -m ruff check variance_lab tests benchmarks notebooks
	$(BIN)/python -m ruff format --check variance_lab tests benchmarks
	$(BIN)/python -m pytest -n auto --dist loadfile --durations=15

test-slow: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -m slow

# The benchmark suite (minutes; `make bench ARGS=--quick` for a smoke run): ratios against the machine's limits
bench: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/python -m ruff check variance_lab tests benchmarks notebooks
	$(BIN)/python -m ruff format --check variance_lab tests benchmarks

format: $(VENV)/.installed-dev
	$(BIN)/python -m ruff format variance_lab tests benchmarks

# Refresh the image baselines of tests/report/test_figure_baselines.py after a deliberate drawing change
# (look at tests/baseline/*.png before committing them)
baselines: $(VENV)/.installed-dev
	VARIANCE_LAB_UPDATE_BASELINES=1 $(BIN)/python -m pytest -q tests/report/test_figure_baselines.py

$(VENV)/.installed-docs: pyproject.toml | $(VENV)/.torch
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(VENV)/.installed $(VENV)/.installed-dev $@

# The documentation site (docs/_build/html): API reference, guide, notebooks executed in quick mode,
# figures gallery, MathJax copied in (reads offline); warnings are errors, then every relative link
# and #anchor of the built pages is checked
docs: $(VENV)/.installed-docs
	VARIANCE_LAB_QUICK=1 MPLBACKEND=Agg $(BIN)/python -m sphinx -W --keep-going -b html docs docs/_build/html
	$(BIN)/python docs/check_links.py docs/_build/html

clean:
	rm -rf $(VENV) build *.egg-info docs/_build docs/api/generated
