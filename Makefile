# Two entry points for a fresh machine; each creates .venv and installs what it needs.
#   make demo   build the toy model, train on the bundled examples, show before/after
#   make test   lint + the whole default suite, unit and integration (CPU, toy model, a few minutes): what CI runs
#   make test-unit   the unit tests only, for the inner loop (under a minute on a quiet machine)
#   make docs   the documentation site (MkDocs) into site/, its references generated from the code; strict: a broken
#               link or anchor, or a page missing from the navigation, fails
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit test-slow lint docs bench

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	# the CPU build of torch, pinned exactly: a looser pin makes pip fetch a several-GB CUDA build
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/finetune demo

lint: $(STAMP)
	$(VENV)/bin/ruff check finetune tests bench examples tools
	$(VENV)/bin/ruff format --check finetune tests bench examples tools

# NO_MKDOCS_2_WARNING: Material prints a banner about MkDocs 2 on every build otherwise. No --quiet: it hides the
# warnings from --strict too, and a broken link then passes
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

test: lint docs
	$(VENV)/bin/pytest -q

test-unit: $(STAMP)
	$(VENV)/bin/pytest -q tests/unit

test-slow: $(STAMP)
	$(VENV)/bin/pytest -q -m slow

bench: $(STAMP)
	$(VENV)/bin/pip install -q -e '.[bench]'
	$(VENV)/bin/python bench/throughput.py
