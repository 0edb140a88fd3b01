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

.PHONY: install proto run test test-slow lint bench clean

install: $(INSTALLED)

# Code is generated before the editable install so the generated packages are found.
$(INSTALLED): pyproject.toml $(PROTO_SOURCES) protos/generate.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip 'grpcio-tools>=1.70'
	$(BIN)/python protos/generate.py
	$(PIP) -e '.[dev]'
	touch $@

$(NODE_INSTALLED): $(NODE_DIR)/package.json $(NODE_DIR)/package-lock.json
	cd $(NODE_DIR) && npm ci --no-audit --no-fund
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
	tests/hardening/test_gc_capture_races.py

test: install $(NODE_INSTALLED)
	$(BIN)/pytest -m "not slow"
	CHECKPOINTD_TEST_DB_URL=$(POSTGRES_URL) CHECKPOINTD_TEST_SERVER_ARGS="--store db" $(BIN)/pytest $(CORE_SUITES)
	CHECKPOINTD_TEST_SERVER_ARGS="--watcher off" $(BIN)/pytest tests/service tests/e2e
	cd $(NODE_DIR) && npm test

# The long hardening variants (8 plans x 1,000 checkpoints; 100 extra kill points).
test-slow: install
	$(BIN)/pytest -m slow

lint: install $(NODE_INSTALLED)
	$(BIN)/ruff check service clients/python tests protos/generate.py protos/apidoc.py
	$(BUF) lint protos
	$(BUF) breaking protos --against protos/released/checkpoint-v1.binpb
	$(BIN)/python protos/apidoc.py --check

clean:
	rm -rf $(VENV)
	find protos \( -name '*_pb2*.py*' -o -name '__init__.py' \) -delete

# Side-by-side figures against a shadow-git baseline (tests/bench/README.md); BENCH_ARGS=--quick for a short run.
BENCH_ARGS ?= --sizes 1000,10000,100000 --repeat 5
bench: install
	$(BIN)/python -m tests.bench $(BENCH_ARGS)
	$(BIN)/python tests/bench/bench_postgres.py
