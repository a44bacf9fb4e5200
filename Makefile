# hutch: developer commands. `make run` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

HUTCH_DATA_DIR ?= $(CURDIR)/var
export HUTCH_DATA_DIR

# Python writes and reuses bytecode (__pycache__, git-ignored) even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1, set on the shared machine): otherwise every node a test starts compiles
# hutch's ~250 modules again (about 0.45 s of CPU of a node's 1.0 s start) and every pytest worker
# rewrites and compiles every test module again (most of collection's time). docs/testing.md, "Where the time goes".
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test test-all test-workers test-durations test-slow test-crash test-sim jepsen lint typecheck clean bench-spark browser-deps

# the compiled hot path is rebuilt by the editable install when its source changes (a stale build is
# not used: the pure path runs and the start log says so); the bytecode of src/ and tests/ is written once
# here (both cores), not by the first nodes and both pytest workers at once on a fresh clone
$(STAMP): pyproject.toml setup.py src/hutch/amqp/_cframes.pyx src/hutch/amqp/_ctable.pyx src/hutch/spark/_crecords.pyx
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	$(PY) -m compileall -q -j 0 src tests >/dev/null
	touch $(STAMP)

setup: $(STAMP)

# hutch-server alone runs a worker per usable core (--workers auto, docs/scaling.md), its workers a cluster,
# so quorum queues work; HUTCH_CLUSTER_PORT=N gives it an inter-node port (then it is one process, which other
# nodes may join), HUTCH_CLUSTER_PORT= (set but empty) starts a node that is not clustered (--no-cluster);
# HUTCH_WORKERS=N picks the workers
run: $(STAMP)
	mkdir -p -m 700 $(HUTCH_DATA_DIR)
	if [ -n "$${HUTCH_CLUSTER_PORT-25672}" ]; then exec $(VENV)/bin/hutch-server; \
	else exec $(VENV)/bin/hutch-server --no-cluster; fi

# The test suite in parallel (pytest-xdist): TEST_WORKERS processes (default 4 on CI's 2 cores: most tests
# wait on sockets, timers and nodes; two workers kept about 1.1 of the 2 cores busy, and since session 21
# three left a fifth of the machine idle (pytest 624 s at 3, 579 s at 4, the machine 83 % busy);
# TEST_WORKERS=0 runs it in one process), each test module a unit of work, the costliest first (tests/xdist_schedule.py, by
# tests/durations.json), the 25 slowest tests listed at the end; the workers copies of the client suites
# (test-workers, below) run in the same session. The budget and the rule for new tests:
# docs/testing.md.
TEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadgroup

# while mypy runs (one core), a collection in one process writes the test modules' assertion-rewritten
# bytecode (__pycache__/*-pytest-*.pyc; a fresh clone's first collection costs ~29 s of CPU against ~9 s
# after), so that the TEST_WORKERS workers do not each rewrite every module at once
test: $(STAMP) browser-deps
	$(VENV)/bin/ruff check src tests examples benchmarks
	$(PY) -m pytest -q -p no:cacheprovider --collect-only >/dev/null 2>&1 & collecting=$$!; \
	  $(VENV)/bin/mypy; rc=$$?; wait $$collecting; exit $$rc
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) --durations=25

# What the browser tests (tests/browser/test_ui.py) need: Debian's chromium, and certutil (libnss3-tools) to
# make it trust the test CA for the HTTPS run (both installed when missing and we are root with apt-get),
# and playwright-core (`npm ci` when node_modules is missing or older than the lock file). Never fails:
# without these the browser tests skip and say why.
BROWSER_DIR := tests/browser
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium libnss3-tools

browser-deps:
	@if { [ ! -x /usr/bin/chromium ] || ! command -v certutil >/dev/null 2>&1; } && [ "$$(id -u)" = 0 ] && \
	    command -v apt-get >/dev/null 2>&1; then \
	  echo "browser-deps: installing chromium and libnss3-tools (apt-get)"; \
	  $(APT_INSTALL) >/dev/null 2>&1 || { apt-get update -qq >/dev/null 2>&1 && $(APT_INSTALL) >/dev/null 2>&1; } || \
	  echo "browser-deps: could not install chromium and libnss3-tools; the browser tests will be skipped"; \
	fi
	@if [ ! -d $(BROWSER_DIR)/node_modules ] || [ $(BROWSER_DIR)/package-lock.json -nt $(BROWSER_DIR)/node_modules ]; then \
	  if command -v npm >/dev/null 2>&1; then \
	    echo "browser-deps: npm ci in $(BROWSER_DIR)"; \
	    (cd $(BROWSER_DIR) && npm ci --no-audit --no-fund --loglevel=error >/dev/null 2>&1 && touch node_modules) || \
	    echo "browser-deps: npm ci failed; the browser tests will be skipped"; \
	  else echo "browser-deps: no npm; the browser tests will be skipped"; fi; \
	fi

# the client suites against a node of 2 worker processes (docs/scaling.md): connections land on either worker, so
# publish, deliver, ack, reject, cancel, confirm, dead-lettering and Direct Reply-To cross the worker hop; the
# management API (gathered over the workers), /metrics, the definitions import and the quorum queues of one node
# (members in both workers) too; tests/workers/ pins connections to each worker. `make test` runs these copies
# in the same session as the originals (`<module>[workers2]::test`, marked workers2); this target runs only
# them. Which suites (tests/worker_suites.py), their time and what is left out (and why): docs/testing.md, "make test-workers".
test-workers: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) -m "workers2 and not slow" $$($(PY) tests/worker_suites.py)

# refreshes tests/durations.json (the seconds of each unit of work: the order `make test` hands them out
# in) from a run of the default selection; commit it when modules were added or their cost moved
test-durations: $(STAMP)
	HUTCH_TEST_DURATIONS_OUT=$(CURDIR)/tests/durations.json $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PARALLEL)

test-slow: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --durations=25 -m slow

# everything: `make test` (ruff, mypy, the default selection), then every test marked slow (`make test-slow`)
test-all: test test-slow

# the kill -9 crash loop, long: HUTCH_CRASH_ROUNDS (default 40) and HUTCH_CRASH_SEED pick the run
test-crash: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests/interop/test_persistence.py -k crash_loop_long

# the Raft simulation, long: thousands of seeds (a failing seed prints `python -m tests.sim.replay N`)
test-sim: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m slow tests/sim

# the Jepsen-style quorum queue and stream tests, long (tests/cluster/test_jepsen.py): HUTCH_JEPSEN_NODES (default 3,5; e.g. 5),
# HUTCH_JEPSEN_SEEDS (default 1-4; "1-8" or "3,7,11") and HUTCH_JEPSEN_SECONDS per run (default 60); one summary
# line per run (lost and phantom counts included); figures in artifacts/ if present
jepsen: $(STAMP)
	$(PY) -m pytest -q -s -p no:cacheprovider -m slow tests/cluster/test_jepsen.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests examples benchmarks

# mypy with the configuration in pyproject.toml ([tool.mypy]): strict on the pure layers and the ports
typecheck: $(STAMP)
	$(VENV)/bin/mypy

bench-spark: $(STAMP)
	$(PY) -m hutch.spark.bench --messages 200000 --repeat 3 --per-trigger 20000 --compare-pika

clean:
	rm -rf $(VENV) var build src/*.egg-info .mypy_cache
