# fleetops — developer entry points. Everything builds from nothing: a Python >= 3.12 is found
# on PATH or under pyenv, .venv is created, the lab rootfs is built on first use (root needed).
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

VENV    ?= .venv
PY      := $(VENV)/bin/python
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
export PATH := $(abspath $(BIN)):$(PATH)
export ANSIBLE_CONFIG := $(abspath ansible.cfg)

# A Python >= 3.12: 3.12 first (on PATH, then pyenv), then newer ones, then python3 if it is new enough.
PYTHON ?= $(shell for c in python3.12 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3 2>/dev/null | sort -rV) \
	python3.13 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[3-9]*/bin/python3 2>/dev/null | sort -rV) python3; do \
	p=$$(command -v $$c 2>/dev/null) || continue; \
	$$p -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null && { echo $$p; break; }; done)

.PHONY: help deps venv lock dist docs demo test check test-vm lint sanity unit integration molecule bench bench-scan clean lab-down ee test-ee test-ids soak

help:
	@echo "make demo   - boot a lab fleet, inject real faults, scan it and localhost, tear it down (root)"
	@echo "make test   - lint, sanity, unit + integration tests on the real kernel and labs side by side, molecule (root)"
	@echo "make check  - the inner loop: lint, sanity, the docs site, unit and package tests (no lab, no root)"
	@echo "make test-vm - the VM lab scenario: QEMU hosts with their own kernels (root; about 9 min on 2 idle cores)"
	@echo "make lock   - refresh constraints.txt (the pinned venv and EE) from the package index; then make test"
	@echo "make dist   - dist/: the wheel and sdist of the CLI (the collection inside the wheel) and the collection tarball"
	@echo "make docs   - build the site (docs/ -> docs/_build/html) strictly: a warning or a broken reference fails"
	@echo "make lint   - ruff, mypy, import-linter (the controller's layers), module sizes (700 lines), changelog, ansible-lint"
	@echo "make bench  - benchmarks under bench/ (each prints a ratio against a baseline)"
	@echo "make ee     - build the execution environment localhost/fleetops-ee:latest (podman, local base image; root)"
	@echo "make test-ee - build it, then run fleetops.node.scan in it as AWX does (runner + execution-node stream) on the lab"
	@echo "make soak   - the auto pass simulated: a month over 2,000 hosts and a year over 500 (kills, races, storms; minutes)"
	@echo "make bench-scan - scan throughput at 10/25/50 lab hosts vs the usual playbook, and what each setting buys"

$(STAMP): pyproject.toml setup.py galaxy.yml lab/pyproject.toml constraints.txt
	@if [ -z "$(PYTHON)" ]; then \
		echo "error: no Python >= 3.12 found on PATH or under pyenv (~/.pyenv/versions); install one or set PYTHON=/path/to/python3.12" >&2; exit 2; fi
	@echo "== building $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]' -e ./lab
	@touch $@

# Refresh the lock (constraints.txt) from the package index on purpose, then run make test on it.
lock:
	@if [ -z "$(PYTHON)" ]; then echo "error: no Python >= 3.12 found (set PYTHON=...)" >&2; exit 2; fi
	bash tools/lock.sh $(PYTHON)

venv: $(STAMP)

# The Debian packages the lab and the sanity tests need (root; installs only what is missing, and says so).
deps:
	@bash tools/debian-deps.sh

# The artifacts, versions from galaxy.yml (setup.py): dist/fleetops-<v>-py3-none-any.whl (pip install gives
# `fleetops` and the collection in site-packages) and its sdist; dist/fleetops-node-<v>.tar.gz
# (ansible-galaxy collection install: AWX projects, EEs). tests/integration/test_collection_install.py.
DIST ?= dist
dist: $(STAMP)
	rm -rf $(DIST)
	$(PY) -m build --no-isolation --outdir $(DIST) .
	$(BIN)/ansible-galaxy collection build . --output-path $(DIST)

demo: deps $(STAMP)
	$(BIN)/python -m fleetops_lab.demo

lint: $(STAMP)
	$(BIN)/ruff check src lab tests bench plugins extensions docs
	$(BIN)/ruff format --check src lab tests bench extensions docs
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python tools/module_sizes.py
	$(BIN)/antsibull-changelog lint
	ANSIBLE_COLLECTIONS_PATH=$(abspath collections) $(BIN)/ansible-lint --offline --profile production

# The site: reference pages generated from the code (docs/_ext/fleetops_docs.py), guides, development notes.
# -W --keep-going: every warning is listed, and any fails; -n: every reference must resolve.
docs: $(STAMP)
	$(BIN)/sphinx-build -W --keep-going -n -q -b html docs docs/_build/html
	@echo "== the site: $(abspath docs/_build/html/index.html)"

sanity: $(STAMP)
	bash tests/sanity.sh

unit: $(STAMP)
	$(BIN)/pytest -q -n 2 --dist loadfile tests/unit tests/fleetops

# The auto pass under a simulated month and year (tests/simulation.py; the CI suite runs a week).
soak: $(STAMP)
	$(PY) -m tests.simulation --days 30 --hosts 2000 --seed 1
	$(PY) -m tests.simulation --days 365 --hosts 500 --seed 2

# The inner loop: everything that needs no lab (the docs site included: a broken reference fails it).
check: lint sanity docs unit

# Labs side by side: FLEETOPS_TEST_WORKERS (default 3) xdist workers, each with a lab of its own, then the
# tests marked exclusive (machine-wide kernel state) alone; fails when a test of tests/integration/ids.txt
# did not run (tests/integration/run.sh). Root.
integration: $(STAMP)
	bash tests/integration/run.sh

# After adding, renaming or merging an integration test: rewrite the checked-in list of its ids.
test-ids: $(STAMP)
	$(BIN)/python -m tests.integration.ids write

# VM lab hosts (QEMU, own kernels; TCG where KVM does not boot): about 9 min on 2 idle cores (root).
test-vm: $(STAMP)
	@bash tools/debian-deps.sh --vm
	$(BIN)/pytest -q tests/integration/test_vm_lab.py

molecule: $(STAMP)
	bash tests/molecule/run.sh

# make test also runs the EE (podman) and VM (QEMU) scenarios in tests/integration: their packages too.
# tests/run.sh: the cold builds (lab rootfs, VM image, UCX wheels, EE image) in the background while lint,
# then the unit and package suites (2 xdist workers, a whole file per worker) with sanity and docs beside
# them run; then the integration suite (labs side by side) and molecule. Every stage runs even when one failed, so that one
# CI run reports every failure; each prints its slowest tests, and the run ends with a table of the
# stages' times: where CI's time goes, in CI's log.
test: deps $(STAMP)
	@bash tools/debian-deps.sh --ee --vm --slurm
	bash tests/run.sh

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# The scan at 10, 25 and 50 lab hosts against the hand-written baseline, plus what each speed
# setting buys at 50 (about 10 min; root; the 10-host run is part of `make test`).
bench-scan: $(STAMP)
	$(BIN)/python bench/scan_fleet.py --sizes 10,25,50 --ablation 50

# The execution environment, built by ansible-builder + podman from a base image made locally (ee/build.sh;
# skipped when the image carries the hash of its inputs). Installs podman and runc when missing.
ee: $(STAMP)
	@bash tools/debian-deps.sh --ee
	PY=$(abspath $(PY)) bash ee/build.sh

test-ee: ee
	$(BIN)/pytest -q -s tests/integration/test_ee.py

lab-down: $(STAMP)
	$(BIN)/fleetops-lab down

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache tests/output .ansible docs/_build docs/reference
