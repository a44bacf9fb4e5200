"""The parallel run's units of work and their order (tests/xdist_schedule.py), with stand-in workers.

The scheduler regressed once without a failing test (pytest 9.2 ignored xdist's group suffix, and every
test became a unit of its own): these tests drive `ModuleScheduling` as xdist's controller does and check
that every unit's tests go to one worker, in file order, the costliest unit first.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from xdist_schedule import ModuleScheduling, group_of, load_costs, order_units, repeated_ids

COLLECTION = [
    "tests/unit/test_a.py::test_1", "tests/unit/test_a.py::test_2", "tests/unit/test_a.py::test_3",
    "tests/spark/test_x.py::test_1", "tests/interop/test_b.py::test_1[p-1]", "tests/interop/test_b.py::test_1[p@2]",
    "tests/spark/test_y.py::C::test_2", "tests/browser/test_c.py::test_1",
]


class FakeNode:
    """What the scheduler asks of xdist's WorkerController."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent += indices

    def shutdown(self) -> None:
        self.shutting_down = True


def _config(workers: int) -> Any:
    return SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)


def _run(costs: dict[str, float], workers: int = 2) -> list[FakeNode]:
    """Schedule COLLECTION over `workers` stand-ins, completing each node's tests in the order sent
    (node 0 first whenever both have work), until every test is done."""
    sched = ModuleScheduling(_config(workers), costs=costs)
    nodes = [FakeNode(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, list(COLLECTION))
    sched.schedule()
    done = {node: 0 for node in nodes}
    while not sched.tests_finished:
        node = next(n for n in nodes if done[n] < len(n.sent))
        sched.mark_test_complete(node, node.sent[done[node]])
        done[node] += 1
    return nodes


def test_a_unit_is_a_module_and_the_spark_suite_is_one() -> None:
    assert group_of("tests/unit/test_a.py::test_1") == "tests/unit/test_a.py"
    assert group_of("tests/interop/test_b.py::T::test_1[x::y]") == "tests/interop/test_b.py"
    assert group_of("tests/spark/test_x.py::test_1") == group_of("tests/spark/sub/test_y.py::t") == "spark"


def test_units_go_costliest_first_unknown_ones_at_their_directorys_mean() -> None:
    units = ["tests/unit/a.py", "tests/cluster/b.py", "tests/unit/c.py", "spark", "tests/new/d.py"]
    costs = {"tests/unit/a.py": 1.0, "tests/cluster/x.py": 40.0, "tests/cluster/y.py": 20.0, "spark": 50.0}
    # b: tests/cluster's mean (30 s); c: tests/unit's (1 s); d: no peers (UNKNOWN_S, 5 s)
    assert order_units(units, costs) == ["spark", "tests/cluster/b.py", "tests/new/d.py", "tests/unit/a.py",
                                         "tests/unit/c.py"]
    assert order_units(units, {}) == units  # all equal: collection order


def test_a_workers_copy_is_a_unit_of_its_own_at_its_originals_cost() -> None:
    copy = "tests/interop/test_b.py[workers2]"
    assert group_of(f"{copy}::test_1[p-1]") == copy != group_of("tests/interop/test_b.py::test_1[p-1]")
    costs = {"tests/interop/test_b.py": 40.0, "tests/interop/x.py": 2.0, "tests/interop/y.py": 4.0}
    # the copy unknown to the table: its original's 40 s, not tests/interop's mean (15.3 s)
    assert order_units(["tests/interop/z.py", copy], costs) == [copy, "tests/interop/z.py"]
    assert order_units([copy, "tests/interop/test_b.py"], {**costs, copy: 50.0})[0] == copy  # measured: its own


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_test_runs_once_and_a_unit_stays_on_one_worker_in_file_order(workers: int) -> None:
    nodes = _run({"tests/browser/test_c.py": 30.0, "spark": 20.0}, workers)
    ran = sorted(i for node in nodes for i in node.sent)
    assert ran == list(range(len(COLLECTION)))
    for node in nodes:
        seen: dict[str, list[int]] = {}
        for i in node.sent:
            seen.setdefault(group_of(COLLECTION[i]), []).append(i)
        for unit, indices in seen.items():
            assert indices == sorted(indices), f"{unit} out of file order on {node.gateway.id}"
            everywhere = [i for n in nodes for i in n.sent if group_of(COLLECTION[i]) == unit]
            assert sorted(everywhere) == indices, f"{unit} split over workers"


def test_tests_sharing_an_id_are_found_since_only_one_of_them_would_run() -> None:
    shared = "tests/mgmt/test_openapi.py::test_api_conforms_to_its_description"
    assert repeated_ids([*COLLECTION, shared, shared, COLLECTION[0], shared]) == [shared, COLLECTION[0]]
    assert repeated_ids(COLLECTION) == []
    # why: the scheduler keys a unit's tests by id, so a repeated id is sent once
    sched = ModuleScheduling(_config(1), costs={})
    node = FakeNode("gw0")
    sched.add_node(node)
    sched.add_node_collection(node, [shared, shared, shared])
    sched.schedule()
    assert len(node.sent) == 1


def test_the_costliest_units_start_first_one_per_worker() -> None:
    first, second = _run({"tests/browser/test_c.py": 30.0, "spark": 20.0})
    assert group_of(COLLECTION[first.sent[0]]) == "tests/browser/test_c.py"
    assert group_of(COLLECTION[second.sent[0]]) == "spark"


def test_the_committed_table_names_units_of_this_suite() -> None:
    costs = load_costs()
    assert costs, "tests/durations.json is missing or empty: `make test-durations` writes it"
    assert "spark" in costs and all(v >= 0 for v in costs.values())
    assert all(name == "spark" or name.startswith("tests/") and name.removesuffix("[workers2]").endswith(".py")
               for name in costs)
