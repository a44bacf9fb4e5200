"""Resource alarms: publishers are blocked (connection.blocked to clients that support it), consumers
keep going, and everyone is unblocked when the last alarm clears."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server
from hutch.amqp import spec

from .helpers import RawClient
from .inproc import InProcNode


def wait_for(predicate, conn: pika.BlockingConnection, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        conn.process_data_events(time_limit=0.1)


def connection_states(server: ServerInfo) -> list[str]:
    req = urllib.request.Request(server.mgmt_url + "/api/connections")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        return sorted(c["state"] for c in json.load(resp))


@pytest.mark.parametrize(("config", "reason"), [
    ("vm_memory_high_watermark.relative = 0.0001\n", "low on memory"),
    ("vm_memory_high_watermark.absolute = 1MB\n", "low on memory"),
    ("disk_free_limit.absolute = 1000TB\n", "low on disk"),
], ids=["memory", "memory-absolute", "disk"])
def test_alarm_blocks_publishers_not_consumers(tmp_path: Path, config: str, reason: str) -> None:
    server = start_server(tmp_path, config_text=config)
    try:
        consumer = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
        cch = consumer.channel()
        cch.queue_declare("work")
        # The publisher sends each message's frames in one write: a message whose frames arrive
        # together is taken; one whose body is still arriving is held (issue 15), and pika writes a
        # message's frames one by one, so whether its first message is taken would be a race.
        with RawClient(server.amqp_port) as publisher:
            publisher.handshake()
            publisher.open_channel(1)
            publisher.publish(1, "", "work", b"first")  # taken; then the connection is blocked
            blocked = publisher.expect(spec.Connection.Blocked, 0)
            assert [blocked.reason] == [reason]
            publisher.publish(1, "", "work", b"held back")
            time.sleep(0.5)
            # the consume-only connection is not blocked: it still gets what was taken
            method, _props, body = cch.basic_get("work", auto_ack=True)
            assert body == b"first"
            assert cch.basic_get("work", auto_ack=True)[0] is None  # the second publish was not read
            assert connection_states(server) == ["blocked", "blocking"]
            consumer.close()
            # a blocked connection's socket is not read (as in RabbitMQ), so its close handshake would
            # wait for the alarm to clear: the server's shutdown ends it instead
    finally:
        server.stop()


def test_clearing_the_alarm_unblocks() -> None:
    with InProcNode(monitor_resources=False) as node:
        publisher = pika.BlockingConnection(pika.ConnectionParameters(port=node.amqp_port))
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda _c, _m: events.append("blocked"))
        publisher.add_on_connection_unblocked_callback(lambda _c, _m: events.append("unblocked"))
        ch = publisher.channel()
        ch.queue_declare("alarm-q")
        ch.basic_publish("", "alarm-q", b"before")
        # this connection has published, so it is blocked at once
        node.call(node.node.set_alarm, "memory")
        node.call(node.node.set_alarm, "disk")
        wait_for(lambda: events == ["blocked"], publisher)
        ch.basic_publish("", "alarm-q", b"during 1")
        ch.basic_publish("", "alarm-q", b"during 2")
        publisher.process_data_events(time_limit=0.3)
        assert node.call(lambda: node.node.vhosts["/"].queues["alarm-q"].message_count) == 1
        node.call(node.node.clear_alarm, "memory")
        publisher.process_data_events(time_limit=0.3)
        assert events == ["blocked"]  # one alarm remains: still blocked
        node.call(node.node.clear_alarm, "disk")
        wait_for(lambda: events == ["blocked", "unblocked"], publisher)
        wait_for(lambda: node.call(lambda: node.node.vhosts["/"].queues["alarm-q"].message_count) == 3,
                 publisher)
        bodies = [ch.basic_get("alarm-q", auto_ack=True)[2] for _ in range(3)]
        assert bodies == [b"before", b"during 1", b"during 2"]
        publisher.close()
