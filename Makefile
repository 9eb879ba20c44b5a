# pdmtp: every target documents itself; `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

CACHE_DIR ?= $(HOME)/.cache/pdmtp
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export PDMTP_CACHE_DIR := $(CACHE_DIR)

# Every tier fails loudly instead of skipping when its infrastructure is missing.
export PDMTP_REQUIRE_ALL ?= 1

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test,dev]'
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## Create .venv with pdmtp and its test/dev tools

.PHONY: crd
crd: venv ## Regenerate crds/ from the pydantic model
	$(VENV)/bin/pdmtp crd > crds/pdmtp.io_pddeployments.yaml

.PHONY: lint
lint: venv ## ruff, mypy --strict, import-linter (core stays pure)
	$(VENV)/bin/ruff check operator tests hack images
	$(VENV)/bin/ruff format --check operator tests hack images
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

.PHONY: test-unit
test-unit: venv ## Unit tier: pure core, CLI, CRD drift (seconds)
	$(PY) -m pytest tests/unit -q

.PHONY: test-router
test-router: venv ## Router tier: real vllm-router 0.1.17 against emulated engines on loopback (~1 min)
	$(PY) -m pytest tests/router -q -m router

.PHONY: test
test: lint test-unit test-router ## Every tier CI runs

.PHONY: clean
clean: ## Remove .venv and local state (keeps the binary cache in ~/.cache/pdmtp)
	rm -rf $(VENV) .cluster .pytest_cache .mypy_cache .ruff_cache
