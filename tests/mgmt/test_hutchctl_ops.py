"""hutchctl's queue and connection operations and await_startup (rabbitmqctl's `purge_queue`,
`delete_queue [--if-empty] [--if-unused]`, `close_connection`, `await_startup`) as an operator's script
runs them: a subprocess against a real node of 2 workers, queues in both, checked with pika; every
failure one line on stderr with its exit code (docs/hutchctl.md)."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pika.exceptions import ConnectionClosedByBroker
from tests.conftest import ServerInfo, free_port, start_server
from tests.workers.test_workers import CONFIG, until, worker_of

from hutch.cli.ctl import LISTS

from .helpers import Api, run_ctl, wait_mgmt
from .test_hutchctl import fails, ok

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a node of workers")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = wait_mgmt(start_server(tmp_path_factory.mktemp("ctl-ops"), "--workers", "2", config_text=CONFIG), 60)
    yield info
    info.stop()


def queues_in_both_workers(info: ServerInfo, ch: Any, prefix: str, messages: int) -> list[str]:
    """Two queues, one per worker (fewest-queues placement), each holding `messages` messages."""
    names: dict[int, str] = {}
    for i in range(8):
        name = f"{prefix}-{i}"
        ch.queue_declare(name)
        names.setdefault(worker_of(info, name), name)
        if len(names) == 2:
            break
    assert sorted(names) == [0, 1]
    for name in names.values():
        for j in range(messages):
            ch.basic_publish("", name, b"m%d" % j)
    return list(names.values())


def depth(ch: Any, queue: str) -> int:
    return int(ch.queue_declare(queue, passive=True).method.message_count)


def test_purge_and_delete_queues_in_either_worker(node: ServerInfo) -> None:
    prefix = f"ops-{uuid.uuid4().hex[:6]}"
    with pika.BlockingConnection(pika.ConnectionParameters(port=node.amqp_port)) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        purged = queues_in_both_workers(node, ch, prefix + "-p", 3)
        for queue in purged:
            assert ok(node, "purge_queue", queue) == f"Purging queue '{queue}' in vhost '/' ...\n"
            assert depth(ch, queue) == 0
        deleted = queues_in_both_workers(node, ch, prefix + "-d", 2)
        for queue in deleted:
            assert fails(node, 1, "delete_queue", "--if-empty", queue)  # two ready messages: refused
            assert until(lambda q=queue: depth(ch, q) == 2)
            out = ok(node, "delete_queue", queue)
            assert out == f"Deleting queue '{queue}' on vhost '/' ...\nQueue was successfully deleted with 2 messages\n"
            assert fails(node, 1, "delete_queue", queue) == f"hutchctl: no queue '{queue}' in vhost '/'"
        assert fails(node, 1, "purge_queue", "-p", "nowhere", "q") == 'hutchctl: Virtual host "nowhere" does not exist'
        ch.queue_declare(prefix + "-e")
        assert ok(node, "-q", "--formatter", "json", "delete_queue", "-e", "-u", prefix + "-e") == ""
    assert fails(node, 2, "purge_queue").startswith("hutchctl: error: the following arguments are required: QUEUE")


def test_close_connection_by_name_with_a_reason(node: ServerInfo) -> None:
    """Each worker's connection, closed by the name list_connections shows: 320 with the reason as text."""
    api = Api(node.mgmt_url)
    for worker in (0, 1):
        tag = f"ops-close-{worker}-{uuid.uuid4().hex[:6]}"
        port = json.loads((node.data_dir / "ports.json").read_text())["listeners"][f"amqp_w{worker}"]
        conn = pika.BlockingConnection(pika.ConnectionParameters(port=port, client_properties={"connection_name": tag}))
        rows = until(lambda t=tag: [r for r in json.loads(ok(node, "--formatter", "json", "list_connections", "name",
                                                              "user_provided_name")) if r["user_provided_name"] == t],
                     what="the connection listed")
        name = rows[0]["name"]
        assert ok(node, "close_connection", name, "maintenance window") == \
            f"Closing connection {name}, reason: maintenance window...\n"
        with pytest.raises(ConnectionClosedByBroker) as info:
            until(lambda c=conn: c.process_data_events(0.1), what="the close")
        assert info.value.reply_code == 320 and "maintenance window" in info.value.reply_text
        until(lambda t=tag: not [c for c in api.get("/api/connections").body if c.get("user_provided_name") == t],
              what="the connection gone")
    assert fails(node, 1, "close_connection", "127.0.0.1:1 -> 127.0.0.1:2", "x") == \
        "hutchctl: no connection named '127.0.0.1:1 -> 127.0.0.1:2' (see hutchctl list_connections name)"


def test_await_startup(node: ServerInfo) -> None:
    assert ok(node, "await_startup") == "Waiting for the node to start ...\n"
    assert ok(node, "-q", "await_startup") == ""
    nobody = free_port()
    proc = run_ctl(None, "await_startup", "-t", "1", port=nobody)
    assert proc.returncode == 69 and proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"hutchctl: cannot reach node at http://127.0.0.1:{nobody}: ")
    assert "waited 1 s for the node to start" in proc.stderr
    bad = run_ctl(node, "await_startup", "--password", "wrong")
    assert bad.returncode == 1 and bad.stderr == "hutchctl: authentication failed for user 'guest'\n"


def test_rabbitmqctls_pid_columns_and_transaction_counts(node: ServerInfo) -> None:
    """A script written for rabbitmqctl asks for `pid` and `channel_pid` (hutchctl shows names there) and
    reads the header rabbitmqctl prints; the uncommitted counts of a channel in tx mode."""
    tag = f"ops-cols-{uuid.uuid4().hex[:6]}"
    with pika.BlockingConnection(pika.ConnectionParameters(port=node.amqp_port,
                                                           client_properties={"connection_name": tag})) as conn:
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", queue, b"to ack")
        ch.basic_consume(queue, lambda *_a: None)
        conns = json.loads(ok(node, "--formatter", "json", "list_connections", "pid", "name", "user_provided_name"))
        mine = [c for c in conns if c["user_provided_name"] == tag]
        assert len(mine) == 1 and mine[0]["pid"] == mine[0]["name"]
        channel = f"{mine[0]['name']} (1)"
        assert ok(node, "-q", "list_channels").splitlines()[0].split() == [
            "pid", "user", "consumer_count", "messages_unacknowledged"]
        columns = ("pid", "messages_unacknowledged", "messages_uncommitted", "acks_uncommitted", "transactional")

        def mine_with(**want: object) -> list[dict[str, Any]]:
            conn.process_data_events(0.05)
            rows = json.loads(ok(node, "--formatter", "json", "list_channels", *columns))
            return [r for r in rows if r["pid"] == channel and all(r[k] == v for k, v in want.items())]

        until(lambda: mine_with(messages_unacknowledged=1), what="the delivery unacknowledged")
        ch.tx_select()
        ch.basic_publish("", queue, b"uncommitted")
        ch.basic_ack(1)
        row = until(lambda: mine_with(messages_uncommitted=1, acks_uncommitted=1), what="the tx counted")[0]
        assert row["transactional"] is True
        consumers = json.loads(ok(node, "--formatter", "json", "list_consumers", "queue_name", "channel_pid"))
        assert {"queue_name": queue, "channel_pid": channel} in consumers
        ch.tx_rollback()


def test_every_listing_with_every_column_is_one_tab_separated_row_per_item(node: ServerInfo) -> None:
    """An operator's `list_X col1 col2 ...` with every column hutchctl knows, on a node of 2 workers: exit
    0, the header names the columns asked, and each row has as many tab-separated cells, empty ones too."""
    with pika.BlockingConnection(pika.ConnectionParameters(port=node.amqp_port)) as conn:
        ch = conn.channel()
        queues = queues_in_both_workers(node, ch, f"ops-cols-{uuid.uuid4().hex[:6]}", 1)
        ch.basic_consume(queues[0], lambda *_a: None)
        for command in ("list_queues", "list_exchanges", "list_bindings", "list_connections", "list_channels",
                        "list_consumers", "list_vhosts"):
            columns = list(LISTS[command].columns)
            lines = ok(node, "-q", command, *columns).splitlines()
            assert lines[0].split("\t") == columns, command
            assert len(lines) > 1 and all(len(line.split("\t")) == len(columns) for line in lines), (command, lines)
        for queue in queues:
            ch.queue_delete(queue)
