"""Issue 16: `hutch-server` on its own is a cluster of one, as a RabbitMQ node is, so a quorum queue
works on a node started with no clustering option at all. The tests may not use the default inter-node
port 25672 (parallel test servers would share it), so the port comes from HUTCH_CLUSTER_PORT: no flag
turns clustering on. A node started with --no-cluster refuses quorum queues and says how to get them.
Issue 22: on such a node `hutchctl cluster_status` names the node and product that answered, and
`hutch-storage check` names the queues (their definitions live in the metadata Raft group there).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest
from tests.mgmt.helpers import Api, wait_mgmt

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import connect


def test_a_plain_start_takes_quorum_queues_and_keeps_them(tmp_path: Path) -> None:
    env = {"HUTCH_CLUSTER_PORT": "0"}
    server = start_server(tmp_path, env=env, cluster=None)
    try:
        assert (server.data_dir / ".hutch.secret").exists()  # made on first start: no secret to give
        conn = connect(server.amqp_port)
        ch = conn.channel()
        ok = ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        assert ok.method.queue == "qq"
        ch.confirm_delivery()
        ch.basic_publish("", "qq", b"kept", pika.BasicProperties(delivery_mode=2))
        conn.close()
    finally:
        server.stop()
    again = start_server(tmp_path, env=env, cluster=None)
    try:
        conn = connect(again.amqp_port)
        ch = conn.channel()
        assert ch.queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"}).method.message_count == 1
        method, _props, body = ch.basic_get("qq", auto_ack=True)
        assert method is not None and body == b"kept"
        conn.close()
    finally:
        again.stop()


def test_hutchctl_and_hutch_storage_name_the_node_and_the_queues(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--cluster-port", "0", cluster=None)
    try:
        conn = connect(server.amqp_port)
        ch = conn.channel()
        ch.queue_declare("named-in-check", durable=True)
        ch.confirm_delivery()
        ch.basic_publish("", "named-in-check", b"kept", pika.BasicProperties(delivery_mode=2))
        conn.close()
        status = subprocess.run([sys.executable, "-m", "hutch.cli.ctl", "--port", str(server.management_port),
                                 "cluster_status"], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        lines = status.stdout.splitlines()
        assert lines[0] == "Cluster status of node test@localhost ..."
        assert lines[1] == "Node: test@localhost" and lines[2].startswith("Product: hutch ")
    finally:
        server.stop()
    check = subprocess.run([sys.executable, "-m", "hutch.cli.storage", "check", str(server.data_dir)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "queue 'named-in-check' in vhost '/'" in check.stdout, check.stdout


def test_no_cluster_refuses_quorum_queues_with_the_way_out(hutch_server: ServerInfo) -> None:
    conn = connect(hutch_server.amqp_port)  # the shared node: the test fixtures' --no-cluster
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        conn.channel().queue_declare("qq-" + uuid.uuid4().hex, durable=True, arguments={"x-queue-type": "quorum"})
    assert info.value.reply_code == 406
    assert "quorum queues need a clustered node (this node was started with --no-cluster" in info.value.reply_text
    conn.close()


@pytest.fixture(scope="module")
def cluster_of_one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    """A cluster of one on a free inter-node port, shared by the tests that only read what it is."""
    server = wait_mgmt(start_server(tmp_path_factory.mktemp("one"), cluster=True))
    yield server
    server.stop()


def test_the_spark_connectors_client_reads_a_quorum_queue(cluster_of_one: ServerInfo) -> None:
    """docs/spark.md: the connector reads quorum queues as classic ones, and a redelivery carries
    x-delivery-count (its `delivery_count` column)."""
    from hutch.amqp.spec import BasicProperties
    from hutch.spark.client import AmqpClient
    from hutch.spark.options import parse_uri

    server, queue = cluster_of_one, "events-" + uuid.uuid4().hex
    conn = connect(server.amqp_port)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", queue, f"e{i}".encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    uri = parse_uri(f"amqp://guest:guest@127.0.0.1:{server.amqp_port}/%2F")
    with AmqpClient(uri).connect() as client:
        assert client.queue_message_count(queue) == 3
        client.consume(queue, prefetch=10)
        first = client.take(3, 5.0)
        assert [d.body for d in first] == [b"e0", b"e1", b"e2"]
        client.requeue(first[0].delivery_tag, multiple=False)
        client.ack(first[2].delivery_tag)
        again = client.take(1, 5.0)
        assert [(d.body, d.redelivered) for d in again] == [(b"e0", True)]
        headers = BasicProperties.decode(again[0].properties_raw, 0).headers or {}
        assert headers.get("x-delivery-count") == 1
        client.ack(again[0].delivery_tag)


def test_a_cluster_of_one_is_a_single_node_cluster_to_the_health_check(cluster_of_one: ServerInfo) -> None:
    reply = Api(cluster_of_one.mgmt_url).get("/api/health/checks/node-is-quorum-critical")
    assert (reply.status, reply.body) == (200, {"status": "ok", "reason": "single node cluster"})
