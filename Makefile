# hutch: developer commands. `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

HUTCH_DATA_DIR ?= $(CURDIR)/var
export HUTCH_DATA_DIR

.PHONY: setup run test test-slow lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	mkdir -p $(HUTCH_DATA_DIR)
	$(VENV)/bin/hutch-server

test: $(STAMP)
	$(VENV)/bin/ruff check src tests
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

clean:
	rm -rf $(VENV) var build src/*.egg-info
