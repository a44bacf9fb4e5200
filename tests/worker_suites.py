"""The client suites that also run against a node of 2 worker processes (docs/testing.md, "make test-workers").

Owns: which test modules are collected a second time as their "workers copy" (`WORKER_SUITES`), the copy's
name (`WORKERS_COPY`: the marker every copied test carries and the suffix of the copy's module node id,
`tests/interop/test_publishing.py[workers2]::test_x`), and which copied tests are left out
(`DESELECTED`: in-process, nothing of workers to test), and which copied tests are slow (`SLOW_COPIES`). tests/conftest.py collects the copies and runs
each copied test with `HUTCH_TEST_WORKERS=2`, so every node the shared fixtures start for it is
`hutch-server --workers 2`; `make test` runs both copies in one session (each copy is a unit of work of
its own, tests/xdist_schedule.py), `make test-workers` only the copies (`-m workers2`), `-m "not workers2"`
only the originals. Run as a script, it prints the modules (the Makefile's `test-workers` passes them).
"""

from __future__ import annotations

WORKERS_COPY = "workers2"
WORKERS_COPY_COUNT = "2"
"""The copy's `HUTCH_TEST_WORKERS`."""

WORKER_SUITES = (
    "tests/interop/test_publishing.py", "tests/interop/test_consuming.py", "tests/interop/test_queues.py",
    "tests/interop/test_queue_features.py", "tests/interop/test_queue_arguments.py",
    "tests/interop/test_confirm_failures.py", "tests/interop/test_clients_aiopika.py",
    "tests/interop/test_clients_kombu.py", "tests/interop/test_clients_pika_asyncio.py",
    "tests/interop/test_queue_features_aiopika.py", "tests/interop/test_exchanges.py", "tests/interop/test_alarms.py",
    "tests/interop/test_consumer_timeout.py", "tests/interop/test_credit_flow.py",
    "tests/mgmt/test_mgmt_api.py", "tests/mgmt/test_mgmt_api2.py", "tests/mgmt/test_prometheus.py",
    "tests/mgmt/test_definitions.py", "tests/mgmt/test_limits.py",
    "tests/cluster/test_quorum_4x.py", "tests/stream_protocol/test_rstream.py",
    "tests/stream_protocol/test_stream_management.py",
)

DESELECTED = frozenset({
    "tests/mgmt/test_prometheus.py::test_ten_thousand_queues_render_every_queue[2000]",  # in-process: no node
    "tests/mgmt/test_prometheus.py::test_ten_thousand_queues_render_every_queue[10000]",
})
"""Tests of `WORKER_SUITES` whose workers copy is not collected (their original's node id)."""

SLOW_COPIES = frozenset({
    "tests/mgmt/test_mgmt_api2.py::test_topic_permissions_and_the_cluster_name_survive_a_restart",
    "tests/mgmt/test_limits.py::test_limits_survive_a_restart",
    "tests/mgmt/test_definitions.py::test_export_import_into_fresh_node_and_restart",
    "tests/mgmt/test_definitions.py::test_load_definitions_at_boot",
    "tests/mgmt/test_definitions.py::test_rabbitmq_310_export_imported_and_users_log_in",
})
"""Tests of `WORKER_SUITES` whose workers copy is marked slow (their original's node id): restarts of a node
of 2 workers (and its boots with a definitions file, and the largest import), 11-16 s each idle in session
19. Their originals run in `make test`, and a node of workers' restart with its definitions and messages
is `make test`'s in tests/workers (test_workers.py, test_worker_forkserver.py); the copies run in `make
test-slow` and `make test-all` (docs/testing.md, "What was done about it in session 20")."""


def copy_nodeid(module: str) -> str:
    """The node id of `module`'s workers copy."""
    return f"{module}[{WORKERS_COPY}]"


def original_nodeid(nodeid: str) -> str:
    """The node id a test of a workers copy has in its original module (itself for an original)."""
    module, sep, rest = nodeid.partition("::")
    suffix = f"[{WORKERS_COPY}]"
    return (module.removesuffix(suffix) + sep + rest) if module.endswith(suffix) else nodeid


if __name__ == "__main__":
    print(" ".join(WORKER_SUITES))
