# checkpointd developer commands. `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PROTO_SOURCES := $(shell find protos -name '*.proto')
PROTO_STAMP := protos/.generated

.PHONY: install proto run test lint bench clean

install: $(INSTALLED) $(PROTO_STAMP)

$(INSTALLED): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

$(PROTO_STAMP): $(INSTALLED) $(PROTO_SOURCES) protos/generate.py
	$(BIN)/python protos/generate.py
	touch $@

proto: $(INSTALLED)
	$(BIN)/python protos/generate.py
	touch $(PROTO_STAMP)

run: install
	$(BIN)/checkpointd serve

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check service clients/python tests protos/generate.py

clean:
	rm -rf $(VENV) $(PROTO_STAMP)
	find protos -name '*_pb2*.py*' -delete -o -name '__init__.py' -delete
