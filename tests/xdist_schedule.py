"""How `make test` shares the suite between its pytest-xdist workers (`-n 3 --dist loadgroup`: the
Makefile's TEST_WORKERS).

Owns: the unit of work (`group_of`: a test module, or "spark" for the whole Spark suite, whose
session-scoped SparkSession is one JVM; a client suite's workers copy, `<module>[workers2]`, is a unit of its
own: it starts nodes of its own), the order in which units are handed out (`order_units`: the
costliest first, by the measured seconds in tests/durations.json), and `ModuleScheduling`, the xdist
scheduler that `tests/conftest.py` installs for `--dist loadgroup` (hook `pytest_xdist_make_scheduler`).

Why a scheduler of our own: xdist's loadgroup finds a test's group in a suffix it appends to the test's
node id (`item._nodeid`); pytest 9.2 computes `nodeid` from another attribute, so the suffix was lost and
every test became a unit of its own, spread over both workers in collection order (a module's
module-scoped node started once per worker, the Spark suite's JVM twice). Here the group is computed
from the node id itself, so it does not depend on how pytest stores it.

Why the costliest first: units are handed out one at a time to the worker that runs out of work; handed
out in collection order, a long unit near the end (the browser runs, the Jepsen seeds) keeps one worker
busy while the other has nothing left (the classic longest-processing-time-first rule bounds that tail
by the shortest of the long units). A unit missing from the table (a new module) costs the mean of its
directory's; `HUTCH_TEST_DURATIONS_OUT=path` writes a new table from a run (`make test-durations`).

Rule: a unit's tests run in one worker, in file order, so module- and session-scoped fixtures start
once per worker that needs them. And every test's node id is its own (`repeated_ids`): the units are dicts
keyed by node id, as xdist's are, so of tests sharing an id only one would run (tests/conftest.py refuses
such a collection).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

DURATIONS_PATH = Path(__file__).with_name("durations.json")
UNKNOWN_S = 5.0
"""The cost of a unit in a directory the durations table does not know at all."""


def group_of(nodeid: str) -> str:
    """The unit of work of the test `nodeid`: its module, or "spark" for the Spark suite."""
    module = nodeid.split("::", 1)[0]
    return "spark" if module.startswith("tests/spark/") else module


def repeated_ids(nodeids: Iterable[str]) -> list[str]:
    """The node ids that `nodeids` holds more than once, in first-seen order. xdist hands tests out by id:
    of the tests sharing one, one runs and the others are silently dropped (schemathesis' own
    `@schema.parametrize()` gave all 149 operation tests of tests/mgmt/test_openapi.py one id, and `make
    test` ran one of them until session 17)."""
    seen: set[str] = set()
    repeated: dict[str, None] = {}
    for nodeid in nodeids:
        if nodeid in seen:
            repeated[nodeid] = None
        seen.add(nodeid)
    return list(repeated)


def load_costs(path: Path = DURATIONS_PATH) -> dict[str, float]:
    """The measured seconds of each unit (tests/durations.json), or {} when the file is missing."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


def _directory(unit: str) -> str:
    return unit.rsplit("/", 1)[0] if "/" in unit else unit


def order_units(units: Iterable[str], costs: Mapping[str, float]) -> list[str]:
    """The units' names, costliest first by `costs`; a unit it does not name costs its original's if it is
    a workers copy (`<module>[workers2]`, tests/worker_suites.py), else the mean of the known units of its
    directory (tests/unit's are cheap, tests/cluster's are not), `UNKNOWN_S` if none. Units of equal cost
    keep their given (collection) order."""
    per_directory: dict[str, list[float]] = {}
    for name, seconds in costs.items():
        per_directory.setdefault(_directory(name), []).append(seconds)

    def cost(name: str) -> float:
        known = costs.get(name)
        if known is None and name.endswith("]") and "[" in name:  # a workers copy: its original's cost
            known = costs.get(name.rsplit("[", 1)[0])
        if known is not None:
            return known
        peers = per_directory.get(_directory(name))
        return sum(peers) / len(peers) if peers else UNKNOWN_S
    return sorted(units, key=lambda name: -cost(name))


class ModuleScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with hutch's units (`group_of`) handed out costliest first."""

    def __init__(self, config: Any, log: Any = None, costs: Mapping[str, float] | None = None) -> None:
        super().__init__(config, log)
        self._costs = load_costs() if costs is None else dict(costs)
        self._index: dict[Any, dict[str, int]] = {}

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)

    def schedule(self) -> None:
        assert self.collection_is_completed
        if self.collection is not None:  # called again (a node joined late): top up every node
            for node in self.nodes:
                self._reschedule(node)
            return
        if not self._check_nodes_have_same_collection():
            self.log("**Different tests collected, aborting run**")
            return
        self.collection = list(next(iter(self.registered_collections.values())))
        if not self.collection:
            return
        units: dict[str, dict[str, bool]] = {}
        for nodeid in self.collection:
            units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
        self.workqueue = OrderedDict((name, units[name]) for name in order_units(units, self._costs))
        for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than units
            unused, _assigned = self.assigned_work.popitem()
            unused.shutdown()
        for node in self.nodes:
            self._assign_work_unit(node)
        for node in self.nodes:  # a second unit as soon as the first is nearly done (xdist's rule)
            self._reschedule(node)
        if not self.workqueue:
            for node in self.nodes:
                node.shutdown()

    def _assign_work_unit(self, node: Any) -> None:
        scope, work_unit = self.workqueue.popitem(last=False)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        index = self._index.get(node)  # a dict: xdist's list.index per test is quadratic in the suite's size
        if index is None:  # built on a node's first unit (a node restarted after a crash is a new one)
            index = self._index[node] = {nodeid: i for i, nodeid in enumerate(self.registered_collections[node])}
        node.send_runtest_some([index[nodeid] for nodeid, done in work_unit.items() if not done])
