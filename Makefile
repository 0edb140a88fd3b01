# checkpointd developer commands. `make run` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check
INSTALLED := $(VENV)/.installed
PROTO_SOURCES := $(shell find protos -name '*.proto')

.PHONY: install proto run test lint bench clean

install: $(INSTALLED)

# Code is generated before the editable install so the generated packages are found.
$(INSTALLED): pyproject.toml $(PROTO_SOURCES) protos/generate.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip 'grpcio-tools>=1.70'
	$(BIN)/python protos/generate.py
	$(PIP) -e '.[dev]'
	touch $@

proto: $(INSTALLED)
	$(BIN)/python protos/generate.py

run: install
	$(BIN)/checkpointd serve

test: install
	$(BIN)/pytest

lint: install
	$(BIN)/ruff check service clients/python tests protos/generate.py

clean:
	rm -rf $(VENV)
	find protos \( -name '*_pb2*.py*' -o -name '__init__.py' \) -delete
