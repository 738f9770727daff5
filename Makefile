# One Makefile for set-up, the demo, tests, lint and benchmarks (SB3-style).
# Every target creates the virtual environment first if it is missing or stale.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# torch build: "cpu" pins the CPU wheel (constraints/cpu.txt); "cuda" takes PyPI's default
# (CUDA) build. Default: cuda when an NVIDIA driver is present, else cpu.
TORCH ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
CONSTRAINTS := $(if $(filter cpu,$(TORCH)),-c constraints/cpu.txt,)
STAMP := $(VENV)/.installed-$(TORCH)
ARGS ?=
# Jupyter refuses to run as root without this flag (containers, CI machines run as root).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: setup demo test test-unit test-slow test-all lint typecheck ui lab bench clean help server server-stop report

help:
	@echo "make demo       set up and run the demo sweep (2x2 grid) on the embedded MLflow store"
	@echo "make test       set up and run the test suite (the default tier: everything not slow)"
	@echo "make test-unit  the unit tier: seconds, no training, subprocess, server or browser"
	@echo "make test-slow  the slow tests (CI runs them too)"
	@echo "make ui         MLflow UI on http://127.0.0.1:5000"
	@echo "make report     review report of the latest sweep (ARGS='--sweep ID' for another)"
	@echo "make lab        JupyterLab on 127.0.0.1 with the project's kernel"
	@echo "make server     team MLflow server (PostgreSQL, basic auth) on http://127.0.0.1:5050"
	@echo "make lint       ruff and the import-linter layer contracts; make typecheck: mypy"

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing workbench into $(VENV) (torch: $(TORCH) build)..."
	$(PY) -m pip install -q $(CONSTRAINTS) -e '.[dev,team,ray,fast]' 2> >(grep -v "^WARNING: Location" >&2)
	$(PY) -m ipykernel install --sys-prefix --name workbench --display-name "Python (workbench)" >/dev/null
	@touch $@

demo: setup
	$(PY) -m workbench sweep experiment=demo sweep=demo $(ARGS)
	$(PY) -m workbench report $(filter tracking.%,$(ARGS))
	@echo "Open the results: the report above (index.html, from disk), or make ui  ->  http://127.0.0.1:5000"

test: setup
	$(PY) -m pytest $(ARGS)

test-unit: setup
	$(PY) -m pytest -m unit $(ARGS)

test-slow: setup
	$(PY) -m pytest -m slow $(ARGS)

test-all: test test-slow

lint: setup
	$(PY) -m ruff check lib tests benchmarks
	$(VENV)/bin/lint-imports --no-cache

typecheck: setup
	$(PY) -m mypy

ui: setup
	$(PY) -m workbench ui $(ARGS)

report: setup
	$(PY) -m workbench report $(ARGS)

lab: setup
	$(VENV)/bin/jupyter lab --ip 127.0.0.1 --no-browser $(ALLOW_ROOT) notebooks/ $(ARGS)

server: setup
	$(PY) -m workbench server start $(ARGS)

server-stop: setup
	$(PY) -m workbench server stop

bench: setup
	$(PY) benchmarks/bench.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
