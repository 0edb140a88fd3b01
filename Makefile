# checkpointd developer commands. `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
INSTALLED := $(VENV)/.installed
PROTO_SOURCES := $(shell find protos -name '*.proto')
NODE_DIR := clients/node
NODE_INSTALLED := $(NODE_DIR)/node_modules/.installed
BUF := $(NODE_DIR)/node_modules/.bin/buf
# The reference MCP filesystem server (pinned) that tests/mcp wraps with `checkpointd mcp-proxy`.
MCP_UPSTREAM_DIR := tests/mcp/upstream
MCP_UPSTREAM_INSTALLED := $(MCP_UPSTREAM_DIR)/node_modules/.installed

.PHONY: install proto run test test-slow test-mutants mutants lint bench dist clean

install: $(INSTALLED)

# Two editable distributions: checkpointd-client (clients/python: the client and the checkpoint.v1
# code its build generates) and checkpointd (the server, with the dev tools). Their build
# requirements go into the venv first, so pip builds both in place without a throwaway build
# environment each; CHECKPOINTD_CLIENT_DEPENDENCY=version makes the server ask for the client by
# version, which the editable client satisfies (see setup.py).
CLIENT_EXTRAS := mcp,langgraph
CLIENT_SPEC := ./clients/python$(if $(CLIENT_EXTRAS),[$(CLIENT_EXTRAS)])
BUILD_CONFIGS := pyproject.toml clients/python/pyproject.toml
BUILD_REQUIRES = $(BIN)/python -c 'import sys, tomllib; [print(r) for f in sys.argv[1:] for r in tomllib.load(open(f, "rb"))["build-system"]["requires"]]'
$(INSTALLED): pyproject.toml setup.py VERSION clients/python/pyproject.toml clients/python/setup.py $(PROTO_SOURCES) protos/generate.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip $$($(BUILD_REQUIRES) $(BUILD_CONFIGS))
	CHECKPOINTD_CLIENT_DEPENDENCY=version $(PIP) --no-build-isolation $$($(BUILD_REQUIRES) $(BUILD_CONFIGS)) \
		-e '$(CLIENT_SPEC)' -e '.[dev]'
	touch $@

$(NODE_INSTALLED): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund
	touch $@

$(MCP_UPSTREAM_INSTALLED): $(MCP_UPSTREAM_DIR)/package.json $(MCP_UPSTREAM_DIR)/package-lock.json
	cd $(MCP_UPSTREAM_DIR) && npm ci --no-audit --no-fund
	touch $@

proto: $(INSTALLED)
	$(BIN)/python protos/generate.py
	$(BIN)/python protos/apidoc.py

run: install
	$(BIN)/checkpointd serve

# The core and interceptor suites run three ways: SQLite + disk store + file watcher (the
# whole suite), PostgreSQL + database store, and with the file watcher off.
POSTGRES_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/postgres
CORE_SUITES := tests/service tests/clients tests/features tests/engine/test_unwatched_changes.py \
	tests/hardening/test_gc_capture_races.py tests/hardening/test_rollback_races.py \
	tests/hardening/test_rollback_journal.py tests/hardening/test_stuck_plan.py tests/langgraph

# Each pass runs in TEST_WORKERS processes (pytest-xdist), a test file per worker at a time (its
# module fixtures and servers stay in one process). On 2 cores: the first pass 12 instead of 22
# minutes, the PostgreSQL one 2 instead of 3 (each server has a database of its own), the
# watcher-off one 35 instead of 45 seconds.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile
test: install $(NODE_INSTALLED) $(MCP_UPSTREAM_INSTALLED)
	$(BIN)/pytest -m "not slow" $(XDIST)
	CHECKPOINTD_TEST_DB_URL=$(POSTGRES_URL) CHECKPOINTD_TEST_SERVER_ARGS="--store db" $(BIN)/pytest $(XDIST) $(CORE_SUITES)
	CHECKPOINTD_TEST_SERVER_ARGS="--watcher off" $(BIN)/pytest $(XDIST) tests/service tests/e2e/test_server_process.py \
		tests/hardening/test_rollback_races.py
	cd $(NODE_DIR) && npm test

# The long hardening variants (8 plans x 1,000 checkpoints; 100 extra kill points; the long model
# runs), two at a time: 6.3 instead of 9.4 minutes on 2 cores.
test-slow: install
	$(BIN)/pytest -m slow -n $(TEST_WORKERS) --dist load

# The curated critical mutants (tests/mutation/critical.toml): fails if the suite misses any
# of them or a patch no longer applies. About 5 minutes on 2 cores; CI runs it.
# CRITICAL_ARGS=--no-baseline skips the run of the selected tests on unmutated code (CI does: its
# `make test` and `make test-slow` have just run them all on the same tree).
CRITICAL_ARGS ?=
test-mutants: install $(NODE_INSTALLED) $(MCP_UPSTREAM_INSTALLED)
	$(BIN)/python -m tests.mutation.critical $(CRITICAL_ARGS)

# Mutation scores of the core modules with cosmic-ray (tests/mutation/README.md); hours, not
# minutes: MUTANTS_ARGS="--module restore ignore" runs some. Reports land in build/mutation/.
MUTANTS_VENV := .venv-mutants
MUTANTS_ARGS ?=
$(MUTANTS_VENV)/.installed:
	test -x $(MUTANTS_VENV)/bin/python || $(PYTHON) -m venv $(MUTANTS_VENV)
	$(MUTANTS_VENV)/bin/python -m pip install --quiet --disable-pip-version-check 'cosmic-ray==8.7.0'
	touch $@

mutants: install $(NODE_INSTALLED) $(MUTANTS_VENV)/.installed
	$(MUTANTS_VENV)/bin/python -m tests.mutation.modules $(MUTANTS_ARGS)

lint: install $(NODE_INSTALLED)
	$(BIN)/ruff check service clients/python tests setup.py protos/generate.py protos/apidoc.py
	$(BUF) lint protos
	$(BUF) breaking protos --against protos/released/checkpoint-v1.binpb
	$(BIN)/python protos/apidoc.py --check

# Release artifacts in dist/: both Python sdists and wheels (each wheel built from its sdist, so the
# server's pins checkpointd-client==VERSION) and the Node client's npm tarball.
dist: install $(NODE_INSTALLED)
	rm -rf dist
	$(BIN)/python -m build --outdir dist clients/python
	$(BIN)/python -m build --outdir dist .
	cd $(NODE_DIR) && npm pack --pack-destination ../../dist

clean:
	rm -rf $(VENV) $(MUTANTS_VENV) dist
	find protos \( -name '*_pb2*.py*' -o -name '__init__.py' \) -delete

# Side-by-side figures against a shadow-git baseline (tests/bench/README.md); BENCH_ARGS=--quick for a short run.
# HISTORY_ARGS: e.g. a repository path or URL and --commits N; SCALE_ARGS=--million adds the 1M-file workspace.
BENCH_ARGS ?= --sizes 1000,10000,100000 --repeat 5
HISTORY_ARGS ?= --commits 200 --rollbacks 20
SCALE_ARGS ?=
bench: install
	$(BIN)/python -m tests.bench $(BENCH_ARGS)
	$(BIN)/python -m tests.bench history $(HISTORY_ARGS)
	$(BIN)/python -m tests.bench scale $(SCALE_ARGS)
	$(BIN)/python tests/bench/bench_postgres.py
