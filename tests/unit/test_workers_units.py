"""The pure parts of worker processes (runtime/workers/): the core count of `--workers auto`, the spec a
worker starts with and the Config it derives, the control messages, the `workers` setting, and the
supervisor's port reservation (bound with SO_REUSEPORT, never listened on)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.config import Config, ConfigError, load_config, parse_config_text
from hutch.runtime.queue_types.remote_type import fewest_queues
from hutch.runtime.workers import control
from hutch.runtime.workers.auto import data_shape, resolve_auto, workers_for
from hutch.runtime.workers.cores import cores_from, usable_cores
from hutch.runtime.workers.spec import WorkerSpec, data_dir_mismatch, worker_config, worker_dir, worker_name
from hutch.runtime.workers.supervisor import reserve_port


@pytest.mark.parametrize(("affinity", "cpu_max", "cores"), [
    (8, None, 8),
    (8, "max 100000", 8),
    (8, "200000 100000", 2),
    (8, "150000 100000", 2),  # 1.5 cores of quota: two workers share it
    (2, "800000 100000", 2),  # the affinity is the smaller
    (8, "50000 100000", 1),
    (0, None, 1),
    (4, "garbage", 4),
    (4, "x 100000", 4),
    (4, "0 100000", 4),
])
def test_cores_from_affinity_and_quota(affinity: int, cpu_max: str | None, cores: int) -> None:
    assert cores_from(affinity, cpu_max) == cores


@given(st.integers(0, 512), st.integers(1, 10**7), st.integers(1, 10**6))
def test_cores_are_at_least_one_and_never_above_the_affinity(affinity: int, quota: int, period: int) -> None:
    cores = cores_from(affinity, f"{quota} {period}")
    assert 1 <= cores <= max(1, affinity)


def test_usable_cores_reads_this_machine(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")
    assert usable_cores(str(quota)) == 1
    assert usable_cores(str(tmp_path / "absent")) >= 1


def test_spec_round_trips_through_the_environment() -> None:
    spec = WorkerSpec(1, 3, 7, {0: 8, 2: 9}, 5672, None, True)
    assert WorkerSpec.from_env(spec.to_env()) == spec
    tls = WorkerSpec(0, 2, 3, {1: 4}, 5672, 5671, False)
    assert WorkerSpec.from_env(tls.to_env()) == tls


def test_worker_config_derives_each_workers_settings() -> None:
    node = Config(data_dir="/d", node_name="n@h", amqp_port=0, stream_port=5552, management_port=15672,
                  cluster_enabled=False, load_definitions="/defs.json", workers=2)
    first = worker_config(node, WorkerSpec(0, 2, 3, {1: 4}, 41000, None, False, stream_port=41001))
    second = worker_config(node, WorkerSpec(1, 2, 3, {0: 4}, 41000, None, False, stream_port=41001))
    assert (first.data_dir, first.node_name, first.amqp_port) == (worker_dir("/d", 0), "n@h#w0", 41000)
    assert (second.data_dir, second.node_name) == ("/d/w1", worker_name("n@h", 1))
    assert first.cluster_enabled and second.cluster_enabled  # the workers are the node's internal cluster
    assert first.cluster_join is None and second.cluster_join is not None
    assert second.cluster_join.startswith("n@h#w0@")
    assert first.stream_port == second.stream_port == 41001  # every worker serves the node's stream port
    assert first.load_definitions == "/defs.json" and second.load_definitions is None
    assert first.cluster_name == second.cluster_name == "n@h"
    assert (first.worker_index, second.worker_index) == (0, 1)


def test_control_messages() -> None:
    assert control.decode(control.encode("ready", {"amqp": 5672})) == {"ready": {"amqp": 5672}}
    with pytest.raises(ValueError):
        control.decode(b"[1]")
    with pytest.raises(ValueError):
        control.decode(b"\xff")
    with pytest.raises(ValueError):
        control.encode("ready", "x" * control.MAX_MESSAGE_BYTES)


@given(st.integers(100, 2**31 - 1))
def test_a_worker_beats_at_least_five_times_per_heartbeat_timeout_and_at_most_once_a_second(timeout_ms: int) -> None:
    beat_s = control.beat_interval_s(timeout_ms)
    assert 0 < beat_s <= control.MAX_BEAT_S and 5 * beat_s <= timeout_ms / 1000 + 1e-9
    assert control.beat_interval_s(5_000) == 1.0  # the default timeout: one beat a second


def test_the_workers_setting() -> None:
    assert load_config({"workers": "auto"}).workers == 0
    assert load_config({"workers": "4"}).workers == 4
    assert load_config({}, {"HUTCH_WORKERS": "2"}).workers == 2
    assert load_config({}).workers == 0  # auto, as RabbitMQ uses every core (runtime/workers/auto.py)
    settings, _raw = parse_config_text("workers = 3\nworkers.own_ports = true\nworkers.heartbeat_timeout = 2000\n")
    assert settings == {"workers": 3, "worker_own_ports": True, "worker_heartbeat_timeout_ms": 2000}
    for bad in ("0", "-1", "1025", "many"):
        with pytest.raises(ConfigError, match="auto or an integer"):
            load_config({"workers": bad})
    assert workers_for(Config(workers=3))[0] == 3
    assert workers_for(Config(workers=0, data_dir="")) == (1, "no data directory")
    assert workers_for(Config(workers=0, data_dir="/nonexistent/hutch"))[0] >= 1
    # whether the inter-node port was given, from any source (auto keeps such a node one process)
    assert not load_config({}).cluster_port_set
    assert load_config({"cluster_port": "25682"}).cluster_port_set
    assert load_config({}, {"HUTCH_CLUSTER_PORT": "0"}).cluster_port_set


def test_auto_resolves_in_the_rules_order() -> None:
    # a data directory keeps its shape, whatever the machine
    assert resolve_auto(8, join=False, cluster_port_set=False, shape=1)[0] == 1
    assert resolve_auto(8, join=False, cluster_port_set=False, shape=3)[0] == 3
    assert resolve_auto(1, join=True, cluster_port_set=True, shape=4)[0] == 4
    # a node set up for a multi-node cluster is one process, and says why
    count, why = resolve_auto(8, join=True, cluster_port_set=False, shape=None)
    assert count == 1 and "--join" in why
    count, why = resolve_auto(8, join=False, cluster_port_set=True, shape=None)
    assert count == 1 and "inter-node port" in why
    # otherwise the usable cores
    assert resolve_auto(8, join=False, cluster_port_set=False, shape=None) == (8, "8 usable cores")
    assert resolve_auto(1, join=False, cluster_port_set=False, shape=None) == (1, "1 usable core")


def test_data_shape_reads_what_the_directory_holds(tmp_path: Path) -> None:
    assert data_shape(str(tmp_path / "missing")) is None
    assert data_shape(str(tmp_path)) is None  # empty: a fresh node
    (tmp_path / "w0").mkdir()
    (tmp_path / "w2").mkdir()
    (tmp_path / "w1").write_text("not a worker's directory")
    (tmp_path / "wx").mkdir()
    assert data_shape(str(tmp_path)) == 3
    lone = tmp_path / "lone"
    (lone / "definitions").mkdir(parents=True)
    assert data_shape(str(lone)) == 1
    only_w1 = tmp_path / "odd"
    (only_w1 / "w1").mkdir(parents=True)
    assert data_shape(str(only_w1)) is None  # no w0: not a node of workers' data
    assert workers_for(Config(workers=0, data_dir=str(tmp_path)))[0] == 3


def test_reserved_port_is_shared_by_reuseport_listeners_only() -> None:
    port, reserved = reserve_port("127.0.0.1", 0)
    try:
        assert port > 0
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", port))  # a worker joins the port
        listener.listen()
        listener.close()
        other = socket.socket()
        with pytest.raises(OSError):  # anyone else is refused: the node keeps its port while workers restart
            other.bind(("127.0.0.1", port))
        other.close()
        with pytest.raises(OSError):  # bound, never listened on: it takes no connection itself
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        for s in reserved:
            s.close()


def test_fewest_queues_placement() -> None:
    assert fewest_queues("n#w0", ["n#w1"], []) == "n#w0"  # a tie: the lower name
    assert fewest_queues("n#w1", ["n#w0"], []) == "n#w0"
    assert fewest_queues("n#w0", ["n#w1", "n#w2"], ["n#w0", "n#w1", "n#w0"]) == "n#w2"
    assert fewest_queues("n#w0", [], ["n#w0", "n#w1"]) == "n#w0"  # a worker that is down is no candidate
    assert fewest_queues("n#w1", ["n#w0"], ["n#w0", "n#w0", "n#w1", "gone"]) == "n#w1"


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=30))
def test_placement_keeps_workers_within_one_queue_of_each_other(start: list[str]) -> None:
    homes = list(start)
    for _ in range(30):
        homes.append(fewest_queues("a", ["b", "c"], homes))
    counts = [homes.count(w) - start.count(w) for w in "abc"]
    assert sum(counts) == 30
    final = [homes.count(w) for w in "abc"]
    assert max(final) - min(final) <= max(1, max(start.count(w) for w in "abc") - min(start.count(w) for w in "abc"))


def test_a_data_directory_keeps_its_shape(tmp_path: Path) -> None:
    lone, workers = tmp_path / "lone", tmp_path / "workers"
    (lone / "definitions").mkdir(parents=True)
    (workers / "w0").mkdir(parents=True)
    assert data_dir_mismatch(str(lone), 1) is None and data_dir_mismatch(str(workers), 2) is None
    assert "one-process node" in (data_dir_mismatch(str(lone), 2) or "")
    assert "start it with --workers" in (data_dir_mismatch(str(workers), 1) or "")
    assert data_dir_mismatch(str(tmp_path / "new"), 2) is None and data_dir_mismatch("", 1) is None


def test_a_fixed_port_held_by_another_node_of_workers_is_refused() -> None:
    port, first = reserve_port("127.0.0.1", 0)
    try:
        with pytest.raises(OSError):  # joining its SO_REUSEPORT group would split clients between two nodes
            reserve_port("127.0.0.1", port)
    finally:
        for s in first:
            s.close()
    again, socks = reserve_port("127.0.0.1", port)  # free again: it can be had
    assert again == port
    for s in socks:
        s.close()


def test_a_replicated_queues_members_are_named_as_nodes_with_the_workers_kept_aside() -> None:
    from hutch.runtime.agent import node_named

    one_node = {"leader": "n@h#w1", "members": ["n@h#w0", "n@h#w1"], "online": ["n@h#w1"]}
    assert node_named(one_node) == {"leader": "n@h", "members": ["n@h"], "online": ["n@h"],
                                    "leader_worker": "n@h#w1", "member_workers": ["n@h#w0", "n@h#w1"]}
    three = {"leader": "b@h#w0", "members": ["a@h#w1", "b@h#w0", "c@h#w1"], "online": ["b@h#w0", "c@h#w1"]}
    assert node_named(three)["members"] == ["a@h", "b@h", "c@h"] and three["online"] == ["b@h", "c@h"]
    plain = {"leader": "a@h", "members": ["a@h", "b@h"], "online": ["a@h"]}
    assert node_named(dict(plain)) == plain  # a one-process node's members are left as they are
    assert node_named({"name": "classic"}) == {"name": "classic"}
