"""A node of 2 workers answers as one node does where the worker hop could reorder effects: consume-ok
after the home worker registered the consumer (single active consumer order), and before the first
delivery to it (py-amqp, as kombu, rejects a delivery to a consumer tag it has no callback for yet), a dead letter in its queue
before the next basic.get, a passive declare of another worker's Direct Reply-To address, and delete-ok
for a queue already gone at its home. Connections are pinned to a worker (`workers.own_ports`).

No polling where one node gives the answer at once: each check is the first read after the action.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import amqp
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker
from tests.conftest import ServerInfo
from tests.workers.test_workers import PERSISTENT, connect, get_one, start_node, until, worker_of

from hutch import portfile


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_node(tmp_path_factory.mktemp("hop-semantics"))
    yield info
    info.stop()


def declare_in(info: ServerInfo, ch: Any, prefix: str, worker: int, **kwargs: Any) -> str:
    """Declare queues named `prefix-N` until one is placed in `worker` (fewest-queues placement alternates:
    the others are kept until then, a deleted one would leave the counts tied as before), then delete the
    others."""
    others: list[str] = []
    try:
        for i in range(6):
            name = f"{prefix}-{i}"
            ch.queue_declare(name, **kwargs)
            if worker_of(info, name) == worker:
                return name
            others.append(name)
        raise AssertionError(f"no queue placed in worker {worker}")
    finally:
        for name in others:
            ch.queue_delete(name)


def test_single_active_consumer_first_consume_ok_across_the_hop_is_active(node: ServerInfo) -> None:
    with connect(node, 0) as c0, connect(node, 1) as c1:
        ch0 = c0.channel()
        q = declare_in(node, ch0, "sac", 0, arguments={"x-single-active-consumer": True})
        far, near = c1.channel(), ch0  # the consumer in worker 1 consumes first, over the hop
        got: list[str] = []
        far.basic_consume(q, lambda c, m, p, b: got.append("far"), auto_ack=True)
        near.basic_consume(q, lambda c, m, p, b: got.append("near"), auto_ack=True)
        ch0.basic_publish("", q, b"x")
        until(lambda: c1.process_data_events(0.05) or c0.process_data_events(0.05) or got,
              what="the delivery")
        assert got == ["far"]
        ch0.queue_delete(q)


def test_no_delivery_before_consume_ok_across_the_hop(node: ServerInfo) -> None:
    """The home worker delivers its backlog as soon as it registers the consumer, before it answers the
    round trip that consume-ok waits for: those deliveries follow consume-ok, none is rejected by the
    client (a rejected one would come back redelivered)."""
    with connect(node, 0) as c0:
        ch = c0.channel()
        q = declare_in(node, ch, "ok-first", 0)
        for i in range(20):
            ch.basic_publish("", q, b"m%d" % i)
        until(lambda: ch.queue_declare(q, passive=True).method.message_count == 20, what="20 ready messages")
        ports = portfile.read(node.data_dir)
        assert ports is not None
        far = amqp.Connection(f"127.0.0.1:{ports['listeners']['amqp_w1']}")
        far.connect()
        try:
            got: list[amqp.Message] = []
            fch = far.channel()
            fch.basic_consume(q, callback=got.append)
            for _ in range(200):  # bounded: 20 deliveries
                if len(got) == 20:
                    break
                far.drain_events(timeout=1)
            assert [m.body for m in got] == [b"m%d" % i for i in range(20)]
            assert not any(m.delivery_info["redelivered"] for m in got)
        finally:
            far.close()
        ch.queue_delete(q)


def test_dead_letter_of_a_reject_across_the_hop_is_in_its_queue_for_the_next_get(node: ServerInfo) -> None:
    with connect(node, 0) as c0:
        ch = c0.channel()
        ch.exchange_declare("hop-dlx", "fanout")
        dead = ch.queue_declare("", exclusive=True).method.queue  # in worker 0, this connection's
        ch.queue_bind(dead, "hop-dlx")
        q = declare_in(node, ch, "rejected", 1, arguments={"x-dead-letter-exchange": "hop-dlx"})
        for i in range(5):
            ch.basic_publish("", q, b"m%d" % i, PERSISTENT)
            method, _props, _body = get_one_unacked(ch, q)
            ch.basic_reject(method.delivery_tag, requeue=False)  # worker 1 dead-letters into worker 0
            method, props, body = ch.basic_get(dead, auto_ack=True)
            assert body == b"m%d" % i and props.headers["x-death"][0]["reason"] == "rejected"
        ch.queue_delete(q)
        ch.exchange_delete("hop-dlx")


def get_one_unacked(ch: Any, queue: str) -> tuple[Any, Any, bytes]:
    return until(lambda: (lambda r: r if r[0] is not None else None)(ch.basic_get(queue)),
                 what=f"a message in {queue}")


def test_passive_declare_of_a_reply_to_address_of_the_other_worker(node: ServerInfo) -> None:
    with connect(node, 0) as requester, connect(node, 1) as server:
        rch, sch = requester.channel(), server.channel()
        sch.queue_declare("rpc-passive")
        rch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: None, auto_ack=True)
        rch.basic_publish("", "rpc-passive", b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        _method, props, _body = get_one(sch, "rpc-passive")
        ok = sch.queue_declare(props.reply_to, passive=True).method
        assert ok.queue == props.reply_to and ok.consumer_count == 1
        rch.close()  # the requester's channel is gone: its address is no more
        requester.process_data_events(0.1)
        with pytest.raises(ChannelClosedByBroker) as gone:
            sch.queue_declare(props.reply_to, passive=True)
        assert gone.value.reply_code == 404
        server.channel().queue_delete("rpc-passive")


def test_delete_of_a_queue_expired_at_its_home_is_delete_ok(node: ServerInfo) -> None:
    with connect(node, 0) as c0:
        ch = c0.channel()
        for i in range(4):  # placed in either worker: one hop or none, delete-ok every time
            q = f"expiring-{i}"
            ch.queue_declare(q, auto_delete=True, arguments={"x-expires": 1})
            assert ch.queue_delete(q).method.message_count == 0


def test_redeclare_of_a_queue_gone_at_its_home_declares_it_anew(node: ServerInfo) -> None:
    """celery's result consumer re-declares its auto-delete reply queue as it reconnects, while the queue's
    home has just deleted it (its last consumer gone): declare-ok (a new queue, as on one node), never 404
    for the stand-in about to go. The home's consumer cancels; the other worker re-declares at once."""
    ports = portfile.read(node.data_dir)
    assert ports is not None
    with connect(node, 0) as c0:
        ch0 = c0.channel()
        for i in range(10):
            q = declare_in(node, ch0, f"gone-at-home-{i}", 1, auto_delete=True)
            c1 = amqp.Connection(f"127.0.0.1:{ports['listeners']['amqp_w1']}")
            c1.connect()
            c1.channel().basic_consume(q, callback=lambda _m: None)
            c1.sock.close()  # its consumer's connection is cut (no close handshake): auto-deleted at its home
            ok = ch0.queue_declare(q, auto_delete=True)  # worker 0's stand-in may still be there
            assert ok.method.queue == q and ok.method.consumer_count == 0
            ch0.queue_delete(q)


@pytest.mark.parametrize("home", [0, 1])
@pytest.mark.parametrize("first_exclusive", [True, False])
def test_exclusive_use_is_judged_across_the_hop(node: ServerInfo, home: int, first_exclusive: bool) -> None:
    """A consumer in one worker (exclusive, or plain) and a second consume in the other worker (plain, or
    exclusive): 403 "in exclusive use" whichever worker is the queue's home, as on one node."""
    with connect(node, 0) as c0, connect(node, 1) as c1:
        ch0 = c0.channel()
        q = declare_in(node, ch0, f"excl-{home}-{int(first_exclusive)}", home)
        ch0.basic_consume(q, lambda *a: None, exclusive=first_exclusive)
        with pytest.raises(ChannelClosedByBroker) as refused:
            c1.channel().basic_consume(q, lambda *a: None, exclusive=not first_exclusive)
        assert refused.value.reply_code == 403
        assert refused.value.reply_text == f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use"
        ch0.queue_delete(q)
