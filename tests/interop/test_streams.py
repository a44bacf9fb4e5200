"""Streams over AMQP 0-9-1 with pika and aio-pika against a real node (RabbitMQ 3.10's behaviour and
texts, compared by hand with a running RabbitMQ: docs/streams.md)."""

from __future__ import annotations

import datetime
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pika
import pytest

from conftest import ServerInfo, start_server

from .helpers import connect, drain, refused, settle, unique

STREAM = {"x-queue-type": "stream"}


def declare(ch: Any, name: str, **arguments: Any) -> str:
    ch.queue_declare(name, durable=True, arguments={**STREAM, **arguments})
    return name


def publish(ch: Any, queue: str, bodies: list[bytes], **props: Any) -> None:
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(**props))


def consume(conn: Any, queue: str, count: int, prefetch: int = 100, timeout: float = 10.0,
            **arguments: Any) -> list[tuple[int, bytes, Any]]:
    """(x-stream-offset, body, properties) of `count` deliveries, acked as they come."""
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got: list[tuple[int, bytes, Any]] = []

    def on_message(c: Any, m: Any, p: Any, b: bytes) -> None:
        got.append((p.headers["x-stream-offset"], b, p))
        c.basic_ack(m.delivery_tag)

    ch.basic_consume(queue, on_message, arguments=arguments)
    drain(conn, got, count, timeout)
    settle(conn, 0.2)
    ch.close()
    return got


@pytest.fixture
def stream(server: ServerInfo) -> Iterator[tuple[Any, Any, str]]:
    """(connection, channel, name) of a new stream, deleted afterwards."""
    conn = connect(server.amqp_port)
    ch = conn.channel()
    name = declare(ch, unique("s"))
    yield conn, ch, name
    if conn.is_open:
        conn.channel().queue_delete(name)
        conn.close()


def test_declare_rules(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    name = unique("s")
    for props, prop in (({"durable": False}, "non-durable"), ({"exclusive": True}, "exclusive-owner"),
                        ({"auto_delete": True}, "auto-delete")):
        ch = conn.channel()
        with refused(406, f"PRECONDITION_FAILED - invalid property '{prop}' for queue '{name}' in vhost '/'"):
            ch.queue_declare(name, **{"durable": True, **props}, arguments=STREAM)
    ch = conn.channel()
    with refused(406, "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue"):
        ch.queue_declare("", durable=True, arguments=STREAM)
    for arg, value in (("x-max-length", 10), ("x-message-ttl", 10), ("x-dead-letter-exchange", "x"),
                       ("x-expires", 1000), ("x-max-age", "7X")):
        ch = conn.channel()
        with refused(406) as r:
            ch.queue_declare(name, durable=True, arguments={**STREAM, arg: value})
        assert r.text.startswith(f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{name}' in vhost '/'")
    ch = conn.channel()
    ok = ch.queue_declare(name, durable=True, arguments={**STREAM, "x-max-age": "7D",
                                                         "x-max-length-bytes": 20_000_000,
                                                         "x-stream-max-segment-size-bytes": 1_000_000})
    assert ok.method.message_count == 0
    ch.queue_delete(name)
    conn.close()


def test_publish_and_read_from_every_kind_of_offset(stream: tuple[Any, Any, str]) -> None:
    conn, ch, q = stream
    props = {"headers": {"k": 1, "s": "str"}, "content_type": "text/plain", "delivery_mode": 2,
             "message_id": "id", "priority": 3, "timestamp": 1_700_000_000, "correlation_id": "c",
             "reply_to": "r", "expiration": "60000", "type": "t", "app_id": "a", "user_id": "guest",
             "content_encoding": "utf8"}
    publish(ch, q, [b"m0", b"m1", b"m2"], **props)
    publish(ch, q, [b"plain"])
    first = consume(conn, q, 4, **{"x-stream-offset": "first"})
    assert [(o, b) for o, b, _ in first] == [(0, b"m0"), (1, b"m1"), (2, b"m2"), (3, b"plain")]
    p = first[0][2]
    assert p.headers == {"k": 1, "s": "str", "x-stream-offset": 0}
    for key, value in props.items():
        if key != "headers":
            assert getattr(p, key) == value, key
    assert first[3][2].headers == {"x-stream-offset": 3}
    assert ch.queue_declare(q, passive=True).method.message_count == 0  # as RabbitMQ answers for a stream
    assert [(o, b) for o, b, _ in consume(conn, q, 2, **{"x-stream-offset": 2})] == [(2, b"m2"), (3, b"plain")]
    assert [(o, b) for o, b, _ in consume(conn, q, 1, **{"x-stream-offset": "last"})] == [(3, b"plain")]
    assert consume(conn, q, 1, timeout=0.5, **{"x-stream-offset": "next"}) == []
    assert len(consume(conn, q, 4, **{"x-stream-offset": "1m"})) == 4
    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=1)
    assert len(consume(conn, q, 4, **{"x-stream-offset": since})) == 4
    # a consumer at `next` gets what is published after it attached
    ch2 = conn.channel()
    ch2.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    ch2.basic_consume(q, lambda c, m, _p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
    settle(conn, 0.2)
    publish(ch, q, [b"late"])
    assert drain(conn, got, 1) == [b"late"]
    ch.queue_delete(q, if_empty=True)  # RabbitMQ deletes a stream whatever it holds


def test_refusals_as_rabbitmq(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    q = declare(ch, unique("s"))
    what = f"queue '{q}' in vhost '/'"
    publish(ch, q, [b"a", b"b"])
    with refused(540, f"NOT_IMPLEMENTED - basic.get not supported by stream queues {what}", connection=True):
        ch.basic_get(q)
    conn = connect(server.amqp_port)
    ch = conn.channel()
    with refused(406, f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'"):
        ch.basic_consume(q, lambda *a: None)
        settle(conn)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    with refused(406, f"PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'"):
        ch.basic_consume(q, lambda *a: None)
        settle(conn)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    with refused(406) as r:
        ch.basic_consume(q, lambda *a: None, arguments={"x-stream-offset": "sometime"})
        settle(conn)
    assert r.text.startswith(f"PRECONDITION_FAILED - invalid arg 'x-stream-offset' for {what}")
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10)
    with refused(540, f"NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues {what}",
                 connection=True):
        ch.basic_consume(q, lambda *a: None, auto_ack=True)
        settle(conn)
    for requeue in (True, False):
        conn = connect(server.amqp_port)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(q, lambda c, m, _p, _b, rq=requeue: c.basic_nack(m.delivery_tag, requeue=rq),
                         arguments={"x-stream-offset": "first"})
        with refused(540, f"NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues {what}",
                     connection=True):
            settle(conn, 1.0)
    conn = connect(server.amqp_port)
    ch = conn.channel()
    with refused(540, f"NOT_IMPLEMENTED - queue.purge not supported by stream queues {what}", connection=True):
        ch.queue_purge(q)
    conn = connect(server.amqp_port)
    conn.channel().queue_delete(q)
    conn.close()


def test_manual_acks_are_credit(stream: tuple[Any, Any, str]) -> None:
    conn, ch, q = stream
    publish(ch, q, [b"%d" % i for i in range(10)])
    cch = conn.channel()
    cch.basic_qos(prefetch_count=3)
    got: list[Any] = []
    cch.basic_consume(q, lambda _c, m, _p, b: got.append((m.delivery_tag, b)),
                      arguments={"x-stream-offset": "first"})
    drain(conn, got, 3)
    settle(conn, 0.3)
    assert [b for _, b in got] == [b"0", b"1", b"2"]  # no more without acks
    cch.basic_ack(got[1][0], multiple=True)
    drain(conn, got, 5)
    settle(conn, 0.3)
    assert [b for _, b in got] == [b"0", b"1", b"2", b"3", b"4"]


def test_a_global_prefetch_limits_a_stream_consumer_too(stream: tuple[Any, Any, str]) -> None:
    """A channel-wide prefetch (global qos) below the consumer's own: the stream delivers up to the lower
    one, and more as acks come (RabbitMQ 3.10.8 by hand: 3 of 10, then 6 after acking the 3). Published
    without confirms, so that several may land in one chunk (delivered as a run: `deliver_run`)."""
    conn, ch, q = stream
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    cch = conn.channel()
    cch.basic_qos(prefetch_count=5)
    cch.basic_qos(prefetch_count=3, global_qos=True)
    got: list[Any] = []
    cch.basic_consume(q, lambda _c, m, _p, b: got.append((m.delivery_tag, b)),
                      arguments={"x-stream-offset": "first"})
    drain(conn, got, 3)
    settle(conn, 0.3)
    assert [b for _, b in got] == [b"0", b"1", b"2"]
    cch.basic_ack(got[-1][0], multiple=True)
    drain(conn, got, 6)
    settle(conn, 0.3)
    assert [b for _, b in got] == [b"%d" % i for i in range(6)]


def test_timestamps_past_what_ms_hold_are_stored_wrapped_as_rabbitmq_does(stream: tuple[Any, Any, str]) -> None:
    """A 0-9-1 timestamp is any u64 of seconds; a stream keeps ms in a signed 64-bit value. RabbitMQ 3.10.8
    stores the publish and wraps (compared by hand: 2^62 and 2^63 come back 0, 2^64-1 as 2^64-1); hutch used
    to close the connection with 541."""
    conn, ch, name = stream
    stamps = [2**62, 2**63, 2**64 - 1, 0, 1_700_000_000]
    ch.confirm_delivery()
    for ts in stamps:
        ch.basic_publish("", name, b"t", pika.BasicProperties(timestamp=ts))
    got = consume(conn, name, len(stamps), **{"x-stream-offset": "first"})
    assert [p.timestamp for _o, _b, p in got] == [0, 0, 2**64 - 1, 0, 1_700_000_000]
    assert conn.is_open


def test_filtering(stream: tuple[Any, Any, str]) -> None:
    conn, ch, q = stream
    ch.confirm_delivery()
    for i, value in enumerate(["eu", "us", None, "eu"]):
        headers = {"x-stream-filter-value": value} if value else None
        ch.basic_publish("", q, b"%d" % i, pika.BasicProperties(headers=headers))
    eu = consume(conn, q, 2, **{"x-stream-offset": "first", "x-stream-filter": "eu"})
    assert [b for _, b, _ in eu] == [b"0", b"3"]
    mixed = consume(conn, q, 3, **{"x-stream-offset": "first", "x-stream-filter": ["us"],
                                   "x-stream-match-unfiltered": True})
    assert [b for _, b, _ in mixed] == [b"1", b"2"]


def test_retention_removes_whole_segments_and_consumers_start_at_the_new_first(server: ServerInfo) -> None:
    conn = connect(server.amqp_port)
    ch = conn.channel()
    q = declare(ch, unique("s"), **{"x-max-length-bytes": 3000, "x-stream-max-segment-size-bytes": 1000})
    for i in range(40):
        publish(ch, q, [b"%03d" % i + b"x" * 100])
    got = consume(conn, q, 1, **{"x-stream-offset": "first"})
    assert got and got[0][0] > 0  # the oldest segments are gone
    last = consume(conn, q, 1, **{"x-stream-offset": "last"})
    assert last[0][1].startswith(b"039")
    ch.queue_delete(q)
    conn.close()


@pytest.mark.parametrize("cluster", [False, True], ids=["no-cluster", "cluster-of-one"])
def test_a_stream_survives_kill_9(tmp_path: Path, cluster: bool) -> None:
    info = start_server(tmp_path, cluster=cluster)
    try:
        conn = connect(info.amqp_port)
        ch = conn.channel()
        q = declare(ch, "kept")
        publish(ch, q, [b"m%d" % i for i in range(100)])
        conn.close()
        info.stop(signal.SIGKILL)
        info = start_server(tmp_path, cluster=cluster)
        conn = connect(info.amqp_port)
        ch = conn.channel()
        declare(ch, "kept")  # an equivalent redeclare
        publish(ch, "kept", [b"after"])
        got = consume(conn, "kept", 101, **{"x-stream-offset": "first"})
        assert [b for _, b, _ in got] == [b"m%d" % i for i in range(100)] + [b"after"]
        assert [o for o, _, _ in got] == list(range(101))
        conn.close()
    finally:
        info.stop()


def test_a_damaged_stream_does_not_keep_the_node_from_starting(tmp_path: Path) -> None:
    info = start_server(tmp_path)
    try:
        conn = connect(info.amqp_port)
        ch = conn.channel()
        declare(ch, "damaged", **{"x-stream-max-segment-size-bytes": 500})
        publish(ch, "damaged", [b"x" * 100 for _ in range(20)])
        declare(ch, "fine")
        publish(ch, "fine", [b"ok"])
        conn.close()
        info.stop()
        # (a node of workers, HUTCH_TEST_WORKERS: each worker's streams are under its own w<N>/)
        streams = [*info.data_dir.glob("streams"), *info.data_dir.glob("w*/streams")]
        [damaged] = [d for s in streams for d in s.iterdir() if len(list(d.iterdir())) > 2]
        first_segment = sorted(damaged.glob("*.segment"))[0]
        with open(first_segment, "r+b") as f:
            f.write(b"JUNK")  # an old segment whose header is gone
        info = start_server(tmp_path)
        conn = connect(info.amqp_port)
        got = consume(conn, "fine", 1, **{"x-stream-offset": "first"})
        assert [b for _, b, _ in got] == [b"ok"]
        with refused(404):
            conn.channel().queue_declare("damaged", passive=True)
        assert damaged.exists()  # left for an operator, not removed as an orphan
        assert "cannot be opened and is left out" in info.log()
        conn.close()
    finally:
        info.stop()


def test_routed_and_dead_lettered_messages_reach_a_stream(stream: tuple[Any, Any, str]) -> None:
    conn, ch, name = stream
    exchange = unique("x")
    ch.exchange_declare(exchange, "fanout", auto_delete=True)
    ch.queue_bind(name, exchange)
    source = unique("q")
    ch.queue_declare(source, auto_delete=True, arguments={"x-dead-letter-exchange": exchange})
    ch.confirm_delivery()
    ch.basic_publish(exchange, "rk", b"routed")
    ch.basic_publish("", source, b"rejected")
    method, _props, _body = ch.basic_get(source)
    ch.basic_reject(method.delivery_tag, requeue=False)
    got = consume(conn, name, 2, **{"x-stream-offset": "first"})
    assert [(b, p.headers.get("x-death", [{}])[0].get("reason")) for _, b, p in got] == [
        (b"routed", None), (b"rejected", "rejected")]
    assert got[0][2].headers["x-stream-offset"] == 0


def test_deleting_a_stream_cancels_its_consumers(stream: tuple[Any, Any, str]) -> None:
    conn, ch, q = stream
    cancelled: list[Any] = []
    ch.basic_qos(prefetch_count=5)
    ch.add_on_cancel_callback(cancelled.append)
    ch.basic_consume(q, lambda *a: None)
    other = conn.channel()
    other.queue_delete(q)
    drain(conn, cancelled, 1)
    assert len(cancelled) == 1


@pytest.mark.asyncio
async def test_aio_pika_publish_and_consume(server: ServerInfo) -> None:
    conn = await aio_pika.connect(server.url)
    ch = await conn.channel(publisher_confirms=True)
    await ch.set_qos(prefetch_count=10)
    name = unique("s")
    queue = await ch.declare_queue(name, durable=True, arguments=STREAM)
    for i in range(5):
        await ch.default_exchange.publish(aio_pika.Message(b"%d" % i, headers={"n": i}), routing_key=name)
    got: list[tuple[int, bytes]] = []
    async with queue.iterator(arguments={"x-stream-offset": "first"}) as it:
        async for message in it:
            got.append((message.headers["x-stream-offset"], message.body))
            await message.ack()
            if len(got) == 5:
                break
    assert got == [(i, b"%d" % i) for i in range(5)]
    await queue.delete()
    await conn.close()


def consume_answers(port: int, queue: str, *, prefetch: int = 0, global_qos: bool = False, auto_ack: bool = False,
                    arguments: dict[str, Any] | None = None) -> list[str]:
    """What the broker answers one basic.consume with, in order, as pika's asynchronous API reports it:
    "consume-ok", "channel-close CODE TEXT", "connection-close CODE TEXT" (then the run stops)."""
    answers: list[str] = []

    def on_channel(ch: Any) -> None:
        def closed(_ch: Any, reason: Any) -> None:
            if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
                answers.append(f"channel-close {reason.reply_code} {reason.reply_text}")
            conn.close() if conn.is_open else None

        ch.add_on_close_callback(closed)

        def consume(_frame: Any = None) -> None:
            ch.basic_consume(queue, lambda *a: None, auto_ack=auto_ack, arguments=arguments,
                             callback=lambda _f: answers.append("consume-ok"))
            conn.ioloop.call_later(0.5, lambda: conn.close() if conn.is_open else None)

        if prefetch:
            ch.basic_qos(prefetch_count=prefetch, global_qos=global_qos, callback=consume)
        else:
            consume()

    def on_closed(_conn: Any, reason: Any) -> None:
        if isinstance(reason, pika.exceptions.ConnectionClosedByBroker):
            answers.append(f"connection-close {reason.reply_code} {reason.reply_text}")
        conn.ioloop.stop()

    conn = pika.SelectConnection(pika.ConnectionParameters("127.0.0.1", port),
                                 on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
                                 on_open_error_callback=lambda *_a: conn.ioloop.stop(),
                                 on_close_callback=on_closed)
    conn.ioloop.call_later(10, conn.ioloop.stop)  # a deadline, never reached when the broker answers
    conn.ioloop.start()
    return answers


def test_a_refused_consumer_never_sees_consume_ok(server: ServerInfo) -> None:
    """RabbitMQ 3.10.8 (by hand, the same steps): each refusal comes instead of basic.consume-ok, never
    after it; a consumer argument of another queue type is refused on streams and on classic queues."""
    conn = connect(server.amqp_port)
    ch = conn.channel()
    q = declare(ch, unique("s"))
    classic = unique("c")
    ch.queue_declare(classic)
    what = f"queue '{q}' in vhost '/'"
    port = server.amqp_port
    no_prefetch = f"channel-close 406 PRECONDITION_FAILED - consumer prefetch count is not set for '{what}'"
    assert consume_answers(port, q) == [no_prefetch]
    assert consume_answers(port, q, prefetch=10, global_qos=True) == [no_prefetch]
    [bad_offset] = consume_answers(port, q, prefetch=10, arguments={"x-stream-offset": "sometime"})
    assert bad_offset.startswith(f"channel-close 406 PRECONDITION_FAILED - invalid arg 'x-stream-offset' for {what}")
    assert consume_answers(port, q, prefetch=10, auto_ack=True) == [
        f"connection-close 540 NOT_IMPLEMENTED - automatic acknowledgement not supported by stream queues {what}"]
    [priority] = consume_answers(port, q, prefetch=10, arguments={"x-priority": 3})
    assert priority.startswith(f"channel-close 406 PRECONDITION_FAILED - invalid arg 'x-priority' for {what}")
    [offset_on_classic] = consume_answers(port, classic, prefetch=10, arguments={"x-stream-offset": "first"})
    assert offset_on_classic.startswith("channel-close 406 PRECONDITION_FAILED - invalid arg 'x-stream-offset' "
                                        f"for queue '{classic}' in vhost '/'")
    assert consume_answers(port, q, prefetch=10, arguments={"x-stream-offset": "first"}) == ["consume-ok"]
    assert consume_answers(port, classic, prefetch=10, arguments={"x-priority": 3}) == ["consume-ok"]
    ch.queue_delete(q)
    ch.queue_delete(classic)
    conn.close()


def _node_pids(pid: int) -> list[int]:
    """The node's process and its children (a node of workers: its workers)."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    return [pid, *(int(p) for p in children.read_text().split())] if children.exists() else [pid]


def _segment_readers(pid: int, data_dir: Path) -> int:
    """How many read-only descriptors of the node's stream segment files are open in the node's processes
    (Linux /proc)."""
    return sum(_segment_readers_of(p, data_dir) for p in _node_pids(pid))


def _segment_readers_of(pid: int, data_dir: Path) -> int:
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.resolve())
            flags = int(next(line.split()[1] for line in Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text().splitlines()
                             if line.startswith("flags:")), 8)
        except (OSError, StopIteration):
            continue  # closed meanwhile
        if target.startswith(str(data_dir.resolve())) and target.endswith(".segment") and flags & 3 == 0:
            n += 1
    return n


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="counts descriptors in /proc")
def test_a_consumer_keeps_one_segment_file_open_and_cancelling_it_closes_it(
        server: ServerInfo, stream: tuple[Any, Any, str]) -> None:
    conn, ch, name = stream
    publish(ch, name, [b"m%d" % i for i in range(300)])
    pid = server.proc.pid
    readers = connect(server.amqp_port)
    got: list[int] = []
    channels = []
    for _ in range(2):  # two consumers reading from `first`: one descriptor each, kept between reads
        c = readers.channel()
        c.basic_qos(prefetch_count=1000)
        c.basic_consume(name, lambda c, m, p, b: got.append(p.headers["x-stream-offset"]),
                        arguments={"x-stream-offset": "first"})
        channels.append(c)
    drain(readers, got, 600, 10.0)
    assert sorted(got) == sorted(list(range(300)) * 2)
    assert _segment_readers(pid, server.data_dir) == 2
    for c in channels:
        c.close()  # the consumers go (their deliveries are unacked: a stream keeps them anyway)
    for _ in range(100):  # the readers' files close as the channels go: waited for, up to 10 s
        if _segment_readers(pid, server.data_dir) == 0:
            break
        settle(readers, 0.1)
    assert _segment_readers(pid, server.data_dir) == 0
    readers.close()
