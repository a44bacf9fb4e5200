"""Issue 16: `hutch-server` on its own is a cluster of one, as a RabbitMQ node is, so a quorum queue
works on a node started with no clustering option at all. The tests may not use the default inter-node
port 25672 (parallel test servers would share it), so the port comes from HUTCH_CLUSTER_PORT: no flag
turns clustering on. A node started with --no-cluster refuses quorum queues and says how to get them.
"""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from conftest import free_port, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import connect


def test_a_plain_start_takes_quorum_queues_and_keeps_them(tmp_path: Path) -> None:
    env = {"HUTCH_CLUSTER_PORT": str(free_port())}
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


def test_no_cluster_refuses_quorum_queues_with_the_way_out(tmp_path: Path) -> None:
    server = start_server(tmp_path)  # the test fixtures' --no-cluster
    try:
        conn = connect(server.amqp_port)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            conn.channel().queue_declare("qq", durable=True, arguments={"x-queue-type": "quorum"})
        assert info.value.reply_code == 406
        assert "quorum queues need a clustered node (this node was started with --no-cluster" in info.value.reply_text
        conn.close()
    finally:
        server.stop()
