"""Nodes of worker processes as members of a multi-node cluster (docs/scaling.md, "A node of workers in a
multi-node cluster"): 3 nodes of 2 workers each, real `hutch-server --workers 2` processes joined with
`--join`, used with pika. They show as 3 nodes (cluster_status, /api/nodes, hutchctl), a quorum queue's 3
members land on 3 different nodes, a classic queue homed in a worker of one node is reached from the
others, and confirmed messages survive a node's `kill -9` (its supervisor and its workers); a running
node of workers joins with `hutchctl join_cluster` and is forgotten (slow). In the slow
set: the node restarts and rejoins, and `forget_cluster_node` of a stopped node of workers removes its
workers.

The placement rules themselves are pure (runtime/workers/membership.py) and tested with Hypothesis in
tests/unit/test_worker_membership.py; the Jepsen runs with workers are in test_jepsen.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from .jepsen import stable_port
from .nodes import Cluster, Node, eventually, node_of

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def connect(node: Node) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0&blocked_connection_timeout=30"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster.start(tmp_path, 3, workers="2")
    try:
        yield c
    finally:
        c.stop()


def _publish(node: Node, queue: str, bodies: list[bytes]) -> None:
    conn = connect(node)
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for body in bodies:
            ch.basic_publish("", queue, body, PERSISTENT, mandatory=True)  # raises unless confirmed
    finally:
        conn.close()


def _consume(node: Node, queue: str, count: int, timeout: float = 20.0) -> list[bytes]:
    conn = connect(node)
    got: list[bytes] = []
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        ch.basic_consume(queue, lambda c, m, _p, body: (got.append(body), c.basic_ack(m.delivery_tag)))
        deadline = time.monotonic() + timeout
        while len(got) < count and time.monotonic() < deadline:
            conn.process_data_events(0.1)
    finally:
        conn.close()
    return got


def test_three_nodes_of_two_workers(cluster: Cluster) -> None:
    n1, n2, n3 = cluster.nodes
    doc = cluster.wait_running({"n1", "n2", "n3"})
    # one node per machine outside: 3 nodes, 6 Raft members (every worker a voter)
    assert doc["running_nodes"] == [n1.full_name, n2.full_name, n3.full_name]
    assert doc["disk_nodes"] == [n1.full_name, n2.full_name, n3.full_name]
    assert len(doc["members"]) == 6 and all(m["voter"] and m["running"] for m in doc["members"])
    code, nodes = n2.api("GET", "/api/nodes")
    assert code == 200 and sorted(x["name"] for x in nodes) == [n1.full_name, n2.full_name, n3.full_name]
    assert all(x["running"] for x in nodes)
    out = n3.ctl("cluster_status")
    assert out.returncode == 0, out.stderr
    assert "Running nodes\n  n3@localhost\n  n1@localhost\n  n2@localhost\n" in out.stdout

    # a quorum queue of 3 members: one on each node
    conn = connect(n1)
    conn.channel().queue_declare("wq", durable=True, arguments={"x-queue-type": "quorum",
                                                                "x-quorum-initial-group-size": 3})
    conn.close()
    info = eventually(lambda: (d := n2.api("GET", "/api/queues/%2F/wq")[1]) and d.get("leader") and d)
    assert sorted(node_of(m) for m in info["members"]) == [n1.full_name, n2.full_name, n3.full_name]

    # a classic queue declared on n2 lives in one of n2's workers; n1 publishes to it, n3 reads it
    conn = connect(n2)
    conn.channel().queue_declare("cq", durable=True)
    conn.close()
    _publish(n1, "cq", [b"c0", b"c1", b"c2"])
    conn = connect(n3)
    ch = conn.channel()
    got = [ch.basic_get("cq", auto_ack=True)[2] for _ in range(3)]
    conn.close()
    assert got == [b"c0", b"c1", b"c2"]

    # confirmed on n1, n3 crashes (kill -9 of its supervisor and its workers), consumed on n2
    bodies = [f"m{i}".encode() for i in range(100)]
    _publish(n1, "wq", bodies)
    n3.kill()
    assert _consume(n2, "wq", len(bodies)) == bodies



@pytest.mark.slow
def test_a_node_of_workers_restarts_rejoins_and_is_forgotten(cluster: Cluster) -> None:
    """(Slow: two more node starts.) A node's crash and restart: its workers rejoin from their logs (the
    others on new ports of their own, re-registered), it serves a quorum queue again; then, stopped, it is
    forgotten by its node name."""
    n1, n2, n3 = cluster.nodes
    conn = connect(n1)
    conn.channel().queue_declare("rq", durable=True, arguments={"x-queue-type": "quorum",
                                                                "x-quorum-initial-group-size": 3})
    conn.close()
    _publish(n2, "rq", [b"before"])
    n3.kill()
    n3.start()
    cluster.wait_running({"n1", "n2", "n3"}, via=n1, timeout=30)
    _publish(n3, "rq", [b"after"])
    assert _consume(n1, "rq", 2) == [b"before", b"after"]

    # forget_cluster_node names the node: both of its workers leave the cluster
    n3.stop()
    code, _ = n1.api("DELETE", "/api/cluster-nodes/n3%40localhost")
    assert code == 204
    doc = n2.api("GET", "/api/cluster-status")[1]
    assert doc["disk_nodes"] == [n2.full_name, n1.full_name] and len(doc["members"]) == 4


@pytest.mark.slow
def test_a_running_node_of_workers_joins_with_join_cluster_and_is_forgotten(tmp_path: Path) -> None:
    """(Slow: two nodes of workers, one restarted: ~35 s on a loaded machine; the refusals, which restart
    nothing, are in tests/workers/test_workers_mgmt.py.) docs/clustering.md's procedure on a node of workers, as on a one-process node: `hutchctl
    join_cluster n1@host:port` on a running node of 2 workers that is a cluster of its own. As RabbitMQ's
    `stop_app; reset; join_cluster; start_app`, its supervisor restarts its workers joining (their own
    definitions and messages dropped), and hutchctl returns once the node's cluster status shows the
    seed: the two nodes (4 workers, 4 Raft members) are one cluster, the joiner sees the seed's queue and
    no longer its own, and, stopped, it is forgotten by its node name."""
    cluster = Cluster.start(tmp_path, 1, workers="2")
    try:
        n1 = cluster.nodes[0]
        conn = connect(n1)
        conn.channel().queue_declare("seed.queue", durable=True)
        conn.close()
        lone = Node("n2", tmp_path / "n2", 0, stable_port(), stable_port(), None, workers="2")
        cluster.nodes.append(lone)
        lone.start()
        conn = connect(lone)
        conn.channel().queue_declare("lone.own", durable=True)
        conn.close()
        _publish(lone, "lone.own", [b"mine"])
        out = lone.ctl("join_cluster", n1.seed, timeout=150)
        assert out.returncode == 0, out.stdout + out.stderr
        doc = cluster.wait_running({"n1", "n2"}, via=n1)
        assert sorted(node_of(m["name"]) for m in doc["members"]) == [n1.full_name] * 2 + [lone.full_name] * 2
        assert "joins the cluster of n1@localhost" in lone.log()
        conn = connect(lone)
        ch = conn.channel()
        ch.queue_declare("seed.queue", durable=True, passive=True)  # the cluster's definitions
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            ch.queue_declare("lone.own", durable=True, passive=True)  # its own were dropped (reset)
        assert gone.value.reply_code == 404
        conn.close()
        lone.stop()
        cluster.wait_running({"n1"}, via=n1)
        out = n1.ctl("forget_cluster_node", lone.full_name)
        assert out.returncode == 0, out.stdout + out.stderr
        doc = n1.api("GET", "/api/cluster-status")[1]
        assert doc["disk_nodes"] == [n1.full_name] and len(doc["members"]) == 2
    finally:
        cluster.stop()

