# hutch: developer commands. `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

HUTCH_DATA_DIR ?= $(CURDIR)/var
export HUTCH_DATA_DIR

.PHONY: setup run test test-slow test-crash test-sim lint clean bench-spark

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	mkdir -p $(HUTCH_DATA_DIR)
	$(VENV)/bin/hutch-server

test: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow

# the kill -9 crash loop, long: HUTCH_CRASH_ROUNDS (default 40) and HUTCH_CRASH_SEED pick the run
test-crash: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests/interop/test_persistence.py -k crash_loop_long

# the Raft simulation, long: thousands of seeds (a failing seed prints `python -m tests.sim.replay N`)
test-sim: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests/sim

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks

bench-spark: $(STAMP)
	$(PY) -m hutch.spark.bench --messages 200000 --repeat 3 --per-trigger 20000 --compare-pika

clean:
	rm -rf $(VENV) var build src/*.egg-info
