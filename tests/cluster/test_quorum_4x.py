"""RabbitMQ 4.x defaults on quorum queues, through pika against a real cluster of one (issue 16, item 3):
a vhost's default queue type (declare and definitions import), the delivery limit's default of 20 and -1,
where a returned message goes, `dead-letter-strategy` from a policy, message priorities, `expires`
renewed by a redeclare, and a requeued message re-appended so the log is truncated under it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest
from tests.conftest import TEST_WORKERS_ENV

from .nodes import FAST, Cluster, Node, eventually

QQ = {"x-queue-type": "quorum"}
SMALL_LOG = "quorum_snapshot_interval = 64\nraft.segment_max_entries = 64\nraft.wal_max_size_bytes = 65536\n"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    c = Cluster(tmp_path_factory.mktemp("qq4x"))
    # one node: under HUTCH_TEST_WORKERS (make test-workers) a node of workers, its quorum members workers
    n = c.add(config_text=FAST + SMALL_LOG, workers=os.environ.get(TEST_WORKERS_ENV) or "1")
    yield n
    c.stop()


def connect(node: Node, vhost: str = "/") -> pika.BlockingConnection:
    params = pika.URLParameters(node.url + "?heartbeat=0")
    params.virtual_host = vhost
    return pika.BlockingConnection(params)


def _vhost(node: Node, name: str, default_type: str) -> None:
    code, body = node.api("PUT", f"/api/vhosts/{name}", {"default_queue_type": default_type})
    assert code in (201, 204), body
    code, body = node.api("PUT", f"/api/permissions/{name}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    assert code in (201, 204), body


def _type(node: Node, vhost: str, queue: str) -> str:
    code, body = node.api("GET", f"/api/queues/{vhost}/{queue}")
    assert code == 200, body
    return body["type"]


# -- default_queue_type --------------------------------------------------------------------------------
def test_default_queue_type_quorum_applies_to_declares_that_suit_it(node: Node) -> None:
    conn = connect(node)
    conn.channel().queue_declare("dqt-old", durable=True)  # classic, before the vhost's default changes
    conn.close()
    _vhost(node, "%2F", "quorum")
    try:
        conn = connect(node)
        ch = conn.channel()
        ch.queue_declare("dqt-q", durable=True)
        assert _type(node, "%2F", "dqt-q") == "quorum"
        ch.queue_declare("dqt-q", durable=True)  # a redeclare without x-queue-type: equivalent
        ch.queue_declare("dqt-old", durable=True)  # the existing classic queue too (no 406)
        assert _type(node, "%2F", "dqt-old") == "classic"
        # what a quorum queue cannot be stays classic (RabbitMQ 4.x's fallback type)
        ch.queue_declare("dqt-excl", durable=True, exclusive=True)
        ch.queue_declare("dqt-ad", durable=True, auto_delete=True)
        ch.queue_declare("dqt-transient", durable=False)
        for name in ("dqt-excl", "dqt-ad", "dqt-transient"):
            assert _type(node, "%2F", name) == "classic", name
        ch.queue_declare("dqt-explicit", durable=True, arguments={"x-queue-type": "classic"})
        assert _type(node, "%2F", "dqt-explicit") == "classic"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:  # an explicit type must match
            ch.queue_declare("dqt-q", durable=True, arguments={"x-queue-type": "classic"})
        assert info.value.reply_code == 406 and "x-queue-type" in info.value.reply_text
        conn.close()
    finally:
        _vhost(node, "%2F", "classic")


def test_definitions_import_uses_the_vhosts_default_queue_type(node: Node) -> None:
    defs: dict[str, Any] = {
        "vhosts": [{"name": "dqt-v", "default_queue_type": "quorum"}],
        "permissions": [{"user": "guest", "vhost": "dqt-v", "configure": ".*", "write": ".*", "read": ".*"}],
        "queues": [{"name": "imported", "vhost": "dqt-v", "durable": True, "auto_delete": False, "arguments": {}},
                   {"name": "imported-ad", "vhost": "dqt-v", "durable": True, "auto_delete": True,
                    "arguments": {}}],
    }
    code, body = node.api("POST", "/api/definitions", defs)
    assert code in (200, 201, 204), body
    assert _type(node, "dqt-v", "imported") == "quorum"
    assert _type(node, "dqt-v", "imported-ad") == "classic"
    conn = connect(node, "dqt-v")
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", "imported", b"m")
    assert eventually(lambda: ch.basic_get("imported", auto_ack=True)[2] == b"m")
    conn.close()


# -- delivery limit ------------------------------------------------------------------------------------
def _get(ch: Any, queue: str) -> tuple[Any, Any, bytes] | None:
    for _ in range(50):
        method, props, body = ch.basic_get(queue)
        if method is not None:
            return method, props, body
        time.sleep(0.05)
    return None


def test_delivery_limit_defaults_to_20_and_a_return_goes_back_to_the_head(node: Node) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("dl-dlq", durable=True)
    ch.queue_declare("dl-20", durable=True, arguments={**QQ, "x-dead-letter-exchange": "",
                                                       "x-dead-letter-routing-key": "dl-dlq"})
    ch.confirm_delivery()
    ch.basic_publish("", "dl-20", b"first")
    ch.basic_publish("", "dl-20", b"second")
    counts = []
    for _ in range(21):
        got = _get(ch, "dl-20")
        assert got is not None
        method, props, body = got
        assert body == b"first"  # with a limit in force a returned message is delivered first again
        counts.append((props.headers or {}).get("x-delivery-count", 0))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == list(range(21))
    got = _get(ch, "dl-dlq")  # returned a 21st time: past the default limit of 20, dead-lettered
    assert got is not None and got[2] == b"first"
    assert got[1].headers["x-death"][0]["reason"] == "delivery_limit"
    got = _get(ch, "dl-20")
    assert got is not None and got[2] == b"second"
    ch.basic_ack(got[0].delivery_tag)
    conn.close()


def test_delivery_limit_minus_one_is_unlimited_and_a_return_goes_to_the_back(node: Node) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("dl-none", durable=True, arguments={**QQ, "x-delivery-limit": -1})
    ch.confirm_delivery()
    for body in (b"a", b"b"):
        ch.basic_publish("", "dl-none", body)
    seen = []
    for _ in range(30):
        got = _get(ch, "dl-none")
        assert got is not None
        seen.append(got[2])
        ch.basic_nack(got[0].delivery_tag, requeue=True)
    assert seen == [b"a", b"b"] * 15  # to the back each time, and never dropped
    conn.close()


# -- dead-letter-strategy from a policy ------------------------------------------------------------------
def test_dead_letter_strategy_from_a_policy_keeps_dead_letters_until_routed(node: Node) -> None:
    code, body = node.api("PUT", "/api/policies/%2F/alo", {
        "pattern": "^alo-pol$", "apply-to": "quorum_queues",
        "definition": {"dead-letter-strategy": "at-least-once", "overflow": "reject-publish",
                       "dead-letter-exchange": "alo-pol-dlx"}})
    assert code in (201, 204), body
    code, body = node.api("PUT", "/api/operator-policies/%2F/alo-op", {
        "pattern": "^nothing$", "apply-to": "queues", "definition": {"dead-letter-strategy": "at-most-once"}})
    assert code in (201, 204), body
    code, body = node.api("PUT", "/api/policies/%2F/bad", {"pattern": "x", "definition": {
        "dead-letter-strategy": "twice"}})
    assert code == 400 and '"twice" is not a valid dead letter strategy' in body["reason"]
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("alo-pol", durable=True, arguments=QQ)
    ch.confirm_delivery()
    ch.basic_publish("", "alo-pol", b"dead")
    got = _get(ch, "alo-pol")
    assert got is not None
    ch.basic_reject(got[0].delivery_tag, requeue=False)  # the dead-letter exchange does not exist yet
    time.sleep(1.5)  # at-most-once would have dropped it by now
    ch.exchange_declare("alo-pol-dlx", "fanout", durable=True)
    ch.queue_declare("alo-pol-target", durable=True)
    ch.queue_bind("alo-pol-target", "alo-pol-dlx")
    got = None
    for _ in range(60):
        got = ch.basic_get("alo-pol-target", auto_ack=True)
        if got[0] is not None:
            break
        time.sleep(0.25)
    assert got is not None and got[2] == b"dead"
    conn.close()
    for path in ("/api/policies/%2F/alo", "/api/operator-policies/%2F/alo-op"):
        node.api("DELETE", path)


# -- priorities ----------------------------------------------------------------------------------------
def test_message_priorities_high_ahead_of_normal_two_to_one(node: Node) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("prio-qq", durable=True, arguments=QQ)
    ch.confirm_delivery()
    for i in range(6):
        ch.basic_publish("", "prio-qq", f"n{i}".encode(), pika.BasicProperties(priority=4 if i % 2 else 0))
    for i in range(6):
        ch.basic_publish("", "prio-qq", f"h{i}".encode(), pika.BasicProperties(priority=5 + i))
    order = [_get(ch, "prio-qq") for _ in range(12)]
    bodies = [g[2].decode() for g in order if g is not None]
    for g in order:
        if g is not None:
            ch.basic_ack(g[0].delivery_tag)
    # rabbit_fifo_q: two high, then the older head (a normal one), while both wait; FIFO within a level
    assert bodies == ["h0", "h1", "n0", "h2", "h3", "n1", "h4", "h5", "n2", "n3", "n4", "n5"]
    conn.close()


# -- expires ------------------------------------------------------------------------------------------
def test_a_redeclare_renews_a_quorum_queues_expires(node: Node) -> None:
    conn = connect(node)
    ch = conn.channel()
    args = {**QQ, "x-expires": 2500}
    ch.queue_declare("exp-qq", durable=True, arguments=args)
    ch.queue_declare("exp-qq-control", durable=True, arguments=args)  # never redeclared
    deadline = time.monotonic() + 12
    while node.api("GET", "/api/queues/%2F/exp-qq-control")[0] == 200:  # each redeclare restarts the countdown
        assert time.monotonic() < deadline
        time.sleep(0.5)
        # checked before each redeclare, which would otherwise make a deleted queue anew
        assert node.api("GET", "/api/queues/%2F/exp-qq")[0] == 200
        ch.queue_declare("exp-qq", durable=True, arguments=args)
    for _ in range(3):  # past the control's deletion, tick granularity (1 s) included
        time.sleep(0.5)
        ch.queue_declare("exp-qq", durable=True, arguments=args, passive=True)
    assert eventually(lambda: node.api("GET", "/api/queues/%2F/exp-qq")[0] == 404, timeout=10)
    conn.close()


# -- requeue and the log ------------------------------------------------------------------------------
def _raft_files(node: Node) -> list[Path]:
    data = node.directory / "data"  # a node of workers keeps each worker's under w<N>/
    return [f for d in (data.glob("cluster/raft"), data.glob("w*/cluster/raft")) for raft in d
            for f in raft.rglob("*") if f.is_file()]


def test_a_message_requeued_many_times_does_not_pin_the_log(node: Node) -> None:
    conn = connect(node)
    ch = conn.channel()
    ch.queue_declare("requeue-qq", durable=True, arguments={**QQ, "x-delivery-limit": -1})
    ch.confirm_delivery()
    ch.basic_publish("", "requeue-qq", b"x" * 2000)
    code, status = node.api("GET", "/api/queues/%2F/requeue-qq/quorum-status")
    assert code == 200, status
    published_at = status[0]["last_applied"]
    for _ in range(600):  # bounded: 600 returns, about 10 snapshot intervals of 64
        got = _get(ch, "requeue-qq")
        assert got is not None and got[2] == b"x" * 2000
        ch.basic_nack(got[0].delivery_tag, requeue=True)

    def truncated() -> bool:
        code, status = node.api("GET", "/api/queues/%2F/requeue-qq/quorum-status")
        return code == 200 and status[0]["first_index"] > published_at

    assert eventually(truncated, timeout=15), node.api("GET", "/api/queues/%2F/requeue-qq/quorum-status")
    # what stays is about two snapshot intervals of entries, not 600 copies of the body
    raft_bytes = sum(f.stat().st_size for f in _raft_files(node))
    assert raft_bytes < 600 * 2000 // 2, raft_bytes
    got = _get(ch, "requeue-qq")
    assert got is not None and got[1].headers["x-delivery-count"] == 600
    ch.basic_ack(got[0].delivery_tag)
    conn.close()
