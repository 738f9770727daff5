# One Makefile for set-up, the demo, tests, lint and benchmarks (SB3-style).
# Every target creates the virtual environment first if it is missing or stale.

SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
# Install routes (docs/gpu-servers.md). The CPU and CUDA variants differ only in the torch
# build, so one lock serves them all. `make deps` installs the third-party packages:
#   1. requirements/lock.txt exactly as locked (--no-deps): every package the project
#      installs (pyproject.toml's dependencies and the extras in EXTRAS) except torch, at the
#      versions CI tests; `make lock` writes it with pip-compile;
#   2. torch==<pinned>+<build> from PyTorch's index for that build, with the CUDA libraries
#      torch pins itself (nvidia-*, triton). scripts/torch_build.py holds the pin, picks the
#      build and says which in one line: TORCH=auto (the default) reads the driver's CUDA
#      level from nvidia-smi (no driver: cpu), or name one: cpu, cu126, cu128, cu130, pypi.
# `make setup` adds the project, editable, with its extras (everything is already there: pip
# only checks that, and `pip check` that the set is consistent), registers the kernel and
# papermill's one-line errors.
# The split lets the Containerfile cache the large first part apart from the code.
# LOCK= (empty) skips step 1 and takes pyproject.toml's ranges (macOS, another Python: the
# lock is for Linux x86_64, Python 3.11). TORCH_INDEX=URL replaces
# https://download.pytorch.org/whl (a mirror); TORCH_INDEX=none leaves torch to pip's own
# configuration (a local wheel directory).
TORCH ?= auto
LOCK ?= requirements/lock.txt
TORCH_INDEX ?=
EXTRAS := dev,team,ray,fast,zoo
DEPS_STAMP := $(VENV)/.deps-$(TORCH)
STAMP := $(VENV)/.installed-$(TORCH)
TORCH_ROUTE = "$(PYTHON)" scripts/torch_build.py $(1) $(2)$(if $(TORCH_INDEX), --index $(TORCH_INDEX))
# One pip install, printed first; this machine's notes about local indexes lacking a package
# are dropped from its stderr. pip installs without compiling bytecode, one file at a time on
# one core; `make deps` compiles the whole environment afterwards on every core (COMPILE).
pip_install = echo "$(PY) -m pip install $(1)" && \
	"$(PY)" -m pip install -q --no-compile $(1) 2> >(grep -v "^WARNING: Location" >&2)
# The installer: the venv's bundled pip (23.2 for Python 3.11) takes twice as long over the
# lock as this one (docs/architecture.md, Tests); an installer that cannot be fetched
# leaves the bundled one, which works, only slower.
PIP_VERSION := 26.3
PIP_UPGRADE = { "$(PY)" -m pip install -q "pip==$(PIP_VERSION)" 2> >(grep -v "^WARNING: Location" >&2) \
	|| echo "note: pip $(PIP_VERSION) not installed; the bundled pip is slower"; }
# Bytecode for everything installed, on every core (-j 0); pip skips files that do not compile
# (a package's Python 2 examples) and so does this (-qq, errors silenced).
COMPILE = "$(PY)" -m compileall -qq -j 0 "$(VENV)/lib" || true
# The project's Jupyter kernel, "workbench" (notebooks, papermill sweeps), and the .pth file
# that makes papermill's own command line end on the workbench's one-line error instead of its
# traceback when a notebook stops on bad input (lib/workbench/notebook_errors.py); `make kernel`
# for an environment made otherwise (conda: make kernel VENV=$$CONDA_PREFIX).
KERNEL := ipykernel install --sys-prefix --name workbench --display-name "Python (workbench)"
PAPERMILL_HOOK := workbench.notebook_errors
ARGS ?=
# Jupyter refuses to run as root without this flag (containers, CI machines run as root).
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)

.PHONY: deps setup kernel git-filter gl-libs lock candidate demo test test-unit test-slow test-all lint typecheck ui lab bench gpu-check \
	clean help server server-stop report

help:
	@echo "make demo       set up and run the demo sweep (2x2 grid) on the embedded MLflow store"
	@echo "make test       set up and run the test suite (the default tier: everything not slow)"
	@echo "make test-unit  the unit tier: seconds, no training, subprocess, server or browser"
	@echo "make test-slow  the slow tests; make test-all: every tier in one session (CI)"
	@echo "make ui         MLflow UI on http://127.0.0.1:5000"
	@echo "make report     review report of the latest sweep (ARGS='--sweep ID' for another)"
	@echo "make lab        JupyterLab on 127.0.0.1 with the project's kernel"
	@echo "make server     team MLflow server (PostgreSQL, basic auth) on http://127.0.0.1:5050"
	@echo "make lint       ruff and the import-linter layer contracts; make typecheck: mypy"
	@echo "make setup      the environment; TORCH=auto|cpu|cu126|cu128|cu130|pypi (docs/gpu-servers.md)"
	@echo "make lock       refresh requirements/lock.txt (pip-compile; ARGS=--upgrade for newer)"
	@echo "make candidate  UPGRADE=PACKAGE==VERSION: a second venv with one upgrade, as a kernel"
	@echo "make gpu-check  GPU server check, <= 8 min: CUDA vs CPU, FP16 export, determinism, ..."

deps: $(DEPS_STAMP)
setup: $(STAMP)

$(DEPS_STAMP): $(LOCK) scripts/torch_build.py
	@set -e; torch="$$($(call TORCH_ROUTE,pip-args,$(TORCH)))"; \
	test -x "$(PY)" || { "$(PYTHON)" -m venv "$(VENV)" && $(PIP_UPGRADE); }; \
	$(if $(LOCK),$(call pip_install,--no-deps -r $(LOCK));) \
	$(call pip_install,$$torch); \
	echo "compiling the environment's bytecode"; $(COMPILE)
	@touch $@

$(STAMP): $(DEPS_STAMP) pyproject.toml
	@$(MAKE) --no-print-directory gl-libs
	@$(call pip_install,-e '.[$(EXTRAS)]')
	"$(PY)" -m pip check
	"$(PY)" -m $(KERNEL) >/dev/null
	"$(PY)" -m $(PAPERMILL_HOOK) >/dev/null
	@$(MAKE) --no-print-directory git-filter
	@touch $@

kernel:
	"$(PY)" -m $(KERNEL)
	"$(PY)" -m $(PAPERMILL_HOOK)

# Notebooks are committed without outputs: .gitattributes routes *.ipynb through nbstripout's
# git filter, and this registers the filter in the checkout's .git/config (outside a git work
# tree, e.g. a container build, there is nothing to do). Git then sees a notebook whose only
# change is outputs as unchanged: a JupyterLab session leaves runs' manifests clean
# (docs/tracking.md#the-manifest). Two settings differ from nbstripout's: cell ids are kept (the
# tests and papermill name cells by id), and the filter is not required, so a checkout whose
# .venv is gone or mounted elsewhere (a container) still answers `git status` and the manifest
# keeps its commit (a notebook with outputs then merely shows as modified). The index is
# refreshed once through the filter: otherwise every run's `git status` (the manifest, with
# --no-optional-locks, never writes the index) filters each notebook a fresh checkout left
# "racily clean" again, a Python start per notebook per run. The kernel's `language_info`, which
# JupyterLab writes into the notebook at every save, is stripped too (papermill reads the
# language from the kernelspec). The interpreter's absolute path is taken by the shell, never by
# make's word functions, so a checkout whose path holds spaces keeps one path.
NBSTRIPOUT_ARGS := --keep-id --extra-keys metadata.language_info
git-filter:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  py="$$(cd "$$(dirname "$(PY)")" && pwd)/$$(basename "$(PY)")" && \
	  { "$$py" -m nbstripout --install --attributes .gitattributes && \
	    git config filter.nbstripout.clean "\"$$py\" -m nbstripout $(NBSTRIPOUT_ARGS)" && \
	    { git config --unset filter.nbstripout.required || true; }; } \
	  || echo "warning: the notebook filter is not registered: notebooks with outputs will show as changed; run make git-filter" >&2; \
	  git update-index -q --really-refresh >/dev/null || true; fi

# Off-screen rendering for rollout videos (docs/videos.md): Mesa's EGL and, as the fallback,
# OSMesa, from Debian/Ubuntu's packages when missing (root only; otherwise the command to run
# is printed and the set-up goes on: without them runs warn once and record no video).
GL_PACKAGES := libegl1 libegl-mesa0 libosmesa6
gl-libs:
	@if ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1' && ldconfig -p | grep -q 'libOSMesa.so'; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "apt-get install $(GL_PACKAGES)"; apt-get update -qq >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(GL_PACKAGES) >/dev/null; \
	else echo "videos need OpenGL libraries: sudo apt-get install $(GL_PACKAGES)"; fi

# Refresh requirements/lock.txt: pip-compile resolves pyproject.toml's dependencies and
# EXTRAS again, keeping every locked version that still fits (ARGS=--upgrade: the newest
# allowed; ARGS='--upgrade-package mlflow': one package). torch is left out of the file and
# resolved as the CPU build, so the lock holds only what every build shares; the CUDA
# builds' nvidia-* and triton come with torch, pinned by it. pip, the installer, is left to
# the venv; setuptools is pinned (torch needs it at run time). Reads PyTorch's CPU index, or
# the CPU wheel from pip's configuration with TORCH_INDEX=none.
CPU_INDEX = $(shell $(call TORCH_ROUTE,index-url,cpu) 2>/dev/null)
comma := ,
PIP_COMPILE = CUSTOM_COMPILE_COMMAND="make lock" "$(VENV)/bin/pip-compile" --quiet --strip-extras \
	  $(foreach extra,$(subst $(comma), ,$(EXTRAS)),--extra $(extra)) \
	  --unsafe-package torch --unsafe-package pip --unsafe-package distribute \
	  --no-emit-index-url --no-emit-find-links \
	  -c <($(call TORCH_ROUTE,requirement,cpu)) \
	  $(if $(CPU_INDEX),--extra-index-url $(CPU_INDEX)) \
	  $(2) -o $(1) pyproject.toml
lock: setup
	$(call PIP_COMPILE,$(LOCK),$(ARGS))

# A candidate software stack beside the project's (docs/benchmarks.md#upgrades): today's lock
# with one upgrade, in its own virtualenv, registered in this one's Jupyter as the kernel
# workbench-<package>-<version>, so that a verification sweep trains A in today's stack and B
# in the candidate's: make candidate UPGRADE=mlflow==3.18.0. The candidate lock is
# pip-compiled from requirements/lock.txt with --upgrade-package (whatever the upgrade needs
# moves with it, the rest stays); a torch upgrade keeps the lock and changes the release
# scripts/torch_build.py installs (WORKBENCH_TORCH_VERSION). Everything lands in
# experiments/candidates/<package>-<version>/ (lock.txt, venv/).
UPGRADE ?=
CANDIDATE = $(subst ==,-,$(UPGRADE))
CANDIDATE_DIR = experiments/candidates/$(CANDIDATE)
CANDIDATE_TORCH = $(if $(filter torch==%,$(UPGRADE)),$(subst torch==,,$(UPGRADE)))
candidate: setup
	@case "$(UPGRADE)" in ?*==?*) ;; *) echo "workbench: error: UPGRADE='$(UPGRADE)': name one upgrade as PACKAGE==VERSION, e.g. make candidate UPGRADE=mlflow==3.18.0" >&2; exit 2;; esac
	mkdir -p "$(CANDIDATE_DIR)"
	cp $(LOCK) "$(CANDIDATE_DIR)/lock.txt"
	$(if $(CANDIDATE_TORCH),,$(call PIP_COMPILE,"$(CANDIDATE_DIR)/lock.txt",--upgrade-package '$(UPGRADE)'))
	WORKBENCH_TORCH_VERSION=$(CANDIDATE_TORCH) $(MAKE) --no-print-directory deps \
	  VENV="$(CANDIDATE_DIR)/venv" LOCK="$(CANDIDATE_DIR)/lock.txt"
	"$(CANDIDATE_DIR)/venv/bin/python" -m pip install -q --no-deps -e .
	"$(CANDIDATE_DIR)/venv/bin/python" -m pip check
	"$(CANDIDATE_DIR)/venv/bin/python" -m ipykernel install --prefix "$(VENV)" \
	  --name "workbench-$(CANDIDATE)" --display-name "Python (workbench, $(UPGRADE))"

demo: setup
	"$(PY)" -m workbench sweep experiment=demo sweep=demo $(ARGS)
	"$(PY)" -m workbench report $(filter tracking.%,$(ARGS))
	@echo "Open the results: the report above (index.html, from disk), or make ui  ->  http://127.0.0.1:5000"

# The test tiers are marker expressions chosen here (pyproject.toml sets none, so
# `pytest tests/<file>::<test>` runs whatever it names): make test runs TIER="not slow", the
# developer's default; TIER=all runs every tier in one pytest session, as CI does (.ci/run), so
# the fixtures the tiers share are built once. TEST_WORKERS pytest-xdist workers share the
# tests (0: in this process); tests/conftest.py keeps the modules that share an expensive
# fixture or time things on one worker. The 25 slowest tests close every run.
TIER ?= not slow
# Where the multi-node Ray tests run (TIER=all or slow), a third worker: they mostly wait on
# Ray (their unit uses about a quarter of a core), and the third keeps both cores busy.
ifeq ($(filter-out all slow,$(TIER)),)
TEST_WORKERS ?= 3
else
TEST_WORKERS ?= 2
endif
PYTEST = "$(PY)" -m pytest --durations=25 -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder \
	$(if $(filter all,$(TIER)),,-m "$(TIER)")

test: setup
	$(PYTEST) $(ARGS)

test-unit: setup
	$(MAKE) --no-print-directory test TIER=unit

test-slow: setup
	$(MAKE) --no-print-directory test TIER=slow

test-all: setup
	$(MAKE) --no-print-directory test TIER=all

lint: setup
	"$(PY)" -m ruff check lib tests benchmarks scripts
	"$(VENV)/bin/lint-imports" --no-cache

typecheck: setup
	"$(PY)" -m mypy

ui: setup
	"$(PY)" -m workbench ui $(ARGS)

report: setup
	"$(PY)" -m workbench report $(ARGS)

# conf/jupyter_lab_config.json: no news feed or update check on the server; the settings
# defaults in conf/jupyterlab/overrides.json: no news question or update toast in the page
# (nothing to fetch on a training server, nothing to cover the notebook).
lab: setup
	"$(VENV)/bin/jupyter" lab --ip 127.0.0.1 --no-browser $(ALLOW_ROOT) \
	  --config=conf/jupyter_lab_config.json --LabApp.app_settings_dir="$(CURDIR)/conf/jupyterlab" \
	  notebooks/ $(ARGS)

server: setup
	"$(PY)" -m workbench server start $(ARGS)

server-stop: setup
	"$(PY)" -m workbench server stop

bench: setup
	"$(PY)" benchmarks/bench.py $(ARGS)

gpu-check: setup
	"$(PY)" benchmarks/gpu_check.py $(ARGS)

clean:
	rm -rf "$(VENV)" .pytest_cache .mypy_cache .ruff_cache
