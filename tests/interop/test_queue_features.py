"""Queue features with a real client (pika) against a real node: message TTL, length limits and overflow
modes, dead-lettering with x-death, delivery limits (poison messages), single active consumer, queue TTL
and per-queue consumer timeout."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from conftest import ServerInfo

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def ch(hutch_server: ServerInfo) -> Iterator[Any]:
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=hutch_server.amqp_port, heartbeat=0))
    channel = conn.channel()
    yield channel
    if conn.is_open:
        conn.close()


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def get_all(ch: Any, queue: str) -> list[tuple[bytes, dict[str, Any]]]:
    out = []
    while True:
        method, props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        out.append((body, props.headers or {}))


def dlx_pair(ch: Any) -> tuple[str, str]:
    """A fanout dead-letter exchange and the queue it feeds."""
    dlx, dead = name("dlx"), name("dead")
    ch.exchange_declare(dlx, "fanout")
    ch.queue_declare(dead)
    ch.queue_bind(dead, dlx)
    return dlx, dead


def wait_for(predicate: Any, conn: Any, timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        conn.process_data_events(time_limit=0.05)
    return predicate()


# -- TTL --------------------------------------------------------------------------------------------
def test_queue_message_ttl_expires_without_a_consumer_and_dead_letters(ch: Any) -> None:
    dlx, dead = dlx_pair(ch)
    q = name("ttl")
    ch.queue_declare(q, arguments={"x-message-ttl": 200, "x-dead-letter-exchange": dlx})
    for i in range(3):
        ch.basic_publish("", q, f"m{i}".encode())
    assert ch.queue_declare(q, passive=True).method.message_count == 3
    got = wait_for(lambda: ch.queue_declare(dead, passive=True).method.message_count == 3, ch.connection)
    assert got
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    msgs = get_all(ch, dead)
    assert [b for b, _h in msgs] == [b"m0", b"m1", b"m2"]
    death = msgs[0][1]["x-death"][0]
    assert death["reason"] == "expired" and death["queue"] == q and death["count"] == 1
    assert death["routing-keys"] == [q] and death["exchange"] == ""
    assert msgs[0][1]["x-first-death-reason"] == "expired"


def test_per_message_expiration_and_the_smaller_of_the_two_wins(ch: Any) -> None:
    q = name("ttl2")
    ch.queue_declare(q, arguments={"x-message-ttl": 60_000})
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="100"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="600000"))
    time.sleep(0.3)
    assert [b for b, _h in get_all(ch, q)] == [b"long"]


def test_ttl_zero_is_delivered_to_a_waiting_consumer_or_not_at_all(ch: Any) -> None:
    q = name("ttl0")
    ch.queue_declare(q, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"nobody")
    time.sleep(0.05)
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    got: list[bytes] = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    ch.basic_publish("", q, b"someone")
    wait_for(lambda: got, ch.connection)
    assert got == [b"someone"]


# -- length limits ----------------------------------------------------------------------------------
def test_max_length_drop_head_dead_letters_the_oldest(ch: Any) -> None:
    dlx, dead = dlx_pair(ch)
    q = name("maxlen")
    ch.queue_declare(q, arguments={"x-max-length": 3, "x-dead-letter-exchange": dlx})
    for i in range(5):
        ch.basic_publish("", q, str(i).encode())
    ch.confirm_delivery()
    assert [b for b, _h in get_all(ch, q)] == [b"2", b"3", b"4"]
    dropped = get_all(ch, dead)
    assert [b for b, _h in dropped] == [b"0", b"1"]
    assert dropped[0][1]["x-death"][0]["reason"] == "maxlen"


def test_max_length_bytes(ch: Any) -> None:
    q = name("maxbytes")
    ch.queue_declare(q, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        ch.basic_publish("", q, body)
    ch.confirm_delivery()
    assert [b for b, _h in get_all(ch, q)] == [b"bbbb", b"cccc"]


def test_reject_publish_nacks_the_publisher(ch: Any) -> None:
    q = name("reject")
    ch.queue_declare(q, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"3")
    assert [b for b, _h in get_all(ch, q)] == [b"1", b"2"]
    ch.basic_publish("", q, b"4")  # room again: acked
    assert [b for b, _h in get_all(ch, q)] == [b"4"]


def test_reject_publish_dlx_nacks_and_dead_letters(ch: Any) -> None:
    dlx, dead = dlx_pair(ch)
    q = name("rejectdlx")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish-dlx",
                                   "x-dead-letter-exchange": dlx})
    ch.confirm_delivery()
    ch.basic_publish("", q, b"kept")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"refused")
    msgs = get_all(ch, dead)
    assert [b for b, _h in msgs] == [b"refused"]
    assert msgs[0][1]["x-death"][0]["reason"] == "maxlen"


# -- dead-lettering on reject, routing key override, delivery mode kept ---------------------------------
def test_reject_without_requeue_dead_letters_with_the_dlx_routing_key(ch: Any) -> None:
    dlx, dead = name("dlxd"), name("deadd")
    ch.exchange_declare(dlx, "direct")
    ch.queue_declare(dead)
    ch.queue_bind(dead, dlx, "to-dead")
    q = name("rej")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": "to-dead"})
    ch.basic_publish("", q, b"bad", PERSISTENT)
    method, _p, _b = ch.basic_get(q)
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = ch.basic_get(dead, auto_ack=True)
    assert body == b"bad" and props.delivery_mode == 2
    death = props.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == q and death["routing-keys"] == [q]
    assert props.headers["x-last-death-queue"] == q


# -- delivery limit (poison messages) -----------------------------------------------------------------
def test_delivery_limit_counts_failed_deliveries_and_dead_letters_past_it(ch: Any) -> None:
    dlx, dead = dlx_pair(ch)
    q = name("poison")
    ch.queue_declare(q, arguments={"x-delivery-limit": 2, "x-dead-letter-exchange": dlx})
    ch.basic_publish("", q, b"poison")
    counts = []
    for _ in range(3):
        method, props, _body = ch.basic_get(q)
        counts.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [None, 1, 2]
    assert ch.basic_get(q)[0] is None  # the third failure was past the limit
    msgs = get_all(ch, dead)
    assert [b for b, _h in msgs] == [b"poison"]
    assert msgs[0][1]["x-death"][0]["reason"] == "delivery_limit"


# -- single active consumer ---------------------------------------------------------------------------
def test_single_active_consumer_fails_over_to_the_next(hutch_server: ServerInfo, ch: Any) -> None:
    q = name("sac")
    ch.queue_declare(q, arguments={"x-single-active-consumer": True})
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    conn_a = pika.BlockingConnection(pika.ConnectionParameters(port=hutch_server.amqp_port, heartbeat=0))
    cha = conn_a.channel()
    cha.basic_consume(q, lambda c, m, p, b: got["a"].append(b), auto_ack=True)
    tag_b = ch.basic_consume(q, lambda c, m, p, b: got["b"].append(b), auto_ack=True)
    for i in range(4):
        ch.basic_publish("", q, str(i).encode())
    wait_for(lambda: len(got["a"]) == 4, conn_a)
    ch.connection.process_data_events(time_limit=0.2)
    assert got == {"a": [b"0", b"1", b"2", b"3"], "b": []}
    conn_a.close()  # the active consumer goes: the next one takes over
    ch.basic_publish("", q, b"4")
    wait_for(lambda: got["b"], ch.connection)
    assert got["b"] == [b"4"]
    ch.basic_cancel(tag_b)


# -- queue TTL ----------------------------------------------------------------------------------------
def test_an_unused_queue_is_deleted_after_x_expires(ch: Any) -> None:
    q = name("expires")
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.basic_publish("", q, b"x")
    time.sleep(0.6)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(q, passive=True)
    assert err.value.reply_code == 404


def test_a_consumed_queue_does_not_expire(ch: Any) -> None:
    q = name("expires2")
    # 1 s, not less: on a loaded machine the consume must reach the queue's home (another worker under
    # HUTCH_TEST_WORKERS=2) before an unused queue's expiry fires; then 1.5 s consumed outlives it
    ch.queue_declare(q, arguments={"x-expires": 1000})
    tag = ch.basic_consume(q, lambda *a: None, auto_ack=True)
    ch.connection.process_data_events(time_limit=1.5)
    ch.queue_declare(q, passive=True)  # still there
    ch.basic_cancel(tag)


# -- consumer timeout per queue -------------------------------------------------------------------------
def test_x_consumer_timeout_closes_the_channel_with_406(ch: Any) -> None:
    q = name("ctimeout")
    ch.queue_declare(q, arguments={"x-consumer-timeout": 300})
    ch.basic_publish("", q, b"slow")
    closed: list[Any] = []
    ch._impl.add_on_close_callback(lambda _channel, reason: closed.append(reason))
    ch.basic_consume(q, lambda *a: None, auto_ack=False)
    wait_for(lambda: closed, ch.connection, timeout=10)
    assert closed and isinstance(closed[0], pika.exceptions.ChannelClosedByBroker)
    assert closed[0].reply_code == 406
    assert "Timeout value used: 300 ms" in closed[0].reply_text


# -- message priorities ---------------------------------------------------------------------------------
def test_priority_queue_delivers_highest_first_fifo_within_a_level(ch: Any) -> None:
    q = name("prio")
    ch.queue_declare(q, arguments={"x-max-priority": 5})
    for body, prio in [(b"a0", 0), (b"b3", 3), (b"c9", 9), (b"d3", 3), (b"e-", None), (b"f5", 5)]:
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    ch.confirm_delivery()
    # 9 is capped at the max (5): it shares level 5 with f5, in publish order
    assert [b for b, _h in get_all(ch, q)] == [b"c9", b"f5", b"b3", b"d3", b"a0", b"e-"]


def test_priority_requeue_goes_back_to_its_place_in_its_level(ch: Any) -> None:
    q = name("prio2")
    ch.queue_declare(q, arguments={"x-max-priority": 2})
    for body, prio in [(b"low1", 0), (b"hi1", 2), (b"hi2", 2), (b"low2", 0)]:
        ch.basic_publish("", q, body, pika.BasicProperties(priority=prio))
    method, _p, body = ch.basic_get(q)
    assert body == b"hi1"
    ch.basic_nack(method.delivery_tag, requeue=True)
    assert [b for b, _h in get_all(ch, q)] == [b"hi1", b"hi2", b"low1", b"low2"]


def test_a_client_supplied_x_death_is_not_taken_for_death_history(ch: Any) -> None:
    """RabbitMQ 4.x: the broker's own death history counts, not an x-death header a client publishes."""
    dlx, dead = dlx_pair(ch)
    q = name("forged")
    ch.queue_declare(q, arguments={"x-dead-letter-exchange": dlx})
    forged = [{"count": 41, "reason": "rejected", "queue": q, "exchange": "", "routing-keys": [q]}]
    ch.basic_publish("", q, b"m", pika.BasicProperties(headers={"x-death": forged, "app": "kept"}))
    method, props, _b = ch.basic_get(q)
    assert props.headers["x-death"][0]["count"] == 41  # delivered as the client sent it
    ch.basic_reject(method.delivery_tag, requeue=False)
    _m, props, _b = ch.basic_get(dead, auto_ack=True)
    deaths = props.headers["x-death"]
    assert len(deaths) == 1 and deaths[0]["count"] == 1 and deaths[0]["reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == q and props.headers["app"] == "kept"
