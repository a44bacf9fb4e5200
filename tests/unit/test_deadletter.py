"""Tests for hutch.core.deadletter: the dead-lettered copy of a message (x-death, x-first/x-last-death-*,
routing keys, expiration) and dead-letter cycle detection, against RabbitMQ 4.x's rabbit_dead_letter / mc
behaviour (the cases of deps/rabbit/test/dead_lettering_SUITE.erl that a pure function can show)."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

import pytest

from hutch.amqp.spec import BasicProperties
from hutch.amqp.table import Timestamp, TypedInt
from hutch.core.deadletter import REASONS, dead_letter, death_queue_names, is_cycle, read_deaths
from hutch.core.message import Message

NOW = 1_700_000_000

# ---------------------------------------------------------------------------------------------------
# helpers


def publish(routing_key: str = "q", exchange: str = "ex", body: bytes = b"payload", **props: Any) -> Message:
    return Message(exchange, routing_key, BasicProperties(**props), body)


def die(msg: Message, queue: str = "q", reason: str = "rejected", now_s: int = NOW, dlx: str = "dlx",
        dlrk: str | None = None) -> tuple[Message, list[str]]:
    return dead_letter(msg, queue=queue, reason=reason, now_s=now_s, dlx=dlx, dlrk=dlrk)


def x_death(msg: Message) -> list[dict[str, Any]]:
    headers = msg.properties.headers
    assert headers is not None
    return headers["x-death"]


def wire(msg: Message) -> BasicProperties:
    """The properties as a client decodes them from the dead-lettered message's encoded header."""
    return BasicProperties.decode(msg.properties_raw, 0)


def typed_table(buf: bytes, offset: int) -> tuple[dict[str, tuple[str, Any]], int]:
    """An independent little decoder that keeps each value's type letter: {key: (letter, value)}."""
    (length,) = struct.unpack_from(">I", buf, offset)
    offset += 4
    end = offset + length
    table: dict[str, tuple[str, Any]] = {}
    while offset < end:
        klen = buf[offset]
        key = buf[offset + 1 : offset + 1 + klen].decode()
        table[key], offset = typed_value(buf, offset + 1 + klen)
    return table, offset


def typed_value(buf: bytes, offset: int) -> tuple[tuple[str, Any], int]:
    letter = chr(buf[offset])
    offset += 1
    if letter == "S":
        (n,) = struct.unpack_from(">I", buf, offset)
        return (letter, buf[offset + 4 : offset + 4 + n].decode()), offset + 4 + n
    if letter in "lT":
        return (letter, struct.unpack_from(">q" if letter == "l" else ">Q", buf, offset)[0]), offset + 8
    if letter in "bI":
        fmt = ">b" if letter == "b" else ">i"
        return (letter, struct.unpack_from(fmt, buf, offset)[0]), offset + struct.calcsize(fmt)
    if letter == "F":
        table, offset = typed_table(buf, offset)
        return (letter, table), offset
    if letter == "A":
        (length,) = struct.unpack_from(">I", buf, offset)
        offset += 4
        end = offset + length
        items = []
        while offset < end:
            item, offset = typed_value(buf, offset)
            items.append(item)
        return (letter, items), offset
    raise AssertionError(f"unexpected type letter {letter!r}")


def typed_headers(msg: Message) -> dict[str, tuple[str, Any]]:
    """The encoded headers table of `msg`, with type letters (headers follow content-type/-encoding)."""
    raw = msg.properties_raw
    flags = raw[0] << 8 | raw[1]
    assert flags & 0x2000, "headers flag not set"
    offset = 2
    for bit in (0x8000, 0x4000):
        if flags & bit:
            offset += 1 + raw[offset]
    return typed_table(raw, offset)[0]


# ---------------------------------------------------------------------------------------------------
# the first death


@pytest.mark.parametrize("reason", REASONS)
def test_each_reason_records_one_death(reason: str) -> None:
    dl, keys = die(publish("rk"), queue="q", reason=reason)
    assert keys == ["rk"]
    assert x_death(dl) == [{
        "count": 1, "reason": reason, "queue": "q", "time": NOW, "exchange": "ex", "routing-keys": ["rk"],
    }]
    headers = dl.properties.headers
    assert headers is not None
    assert (headers["x-first-death-reason"], headers["x-first-death-queue"],
            headers["x-first-death-exchange"]) == (reason, "q", "ex")
    assert (headers["x-last-death-reason"], headers["x-last-death-queue"],
            headers["x-last-death-exchange"]) == (reason, "q", "ex")


def test_unknown_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown dead-letter reason"):
        die(publish(), reason="queue_deleted")


def test_new_message_is_published_to_the_dlx_with_the_first_routing_key() -> None:
    dl, keys = die(publish("orig", exchange="orders"), dlx="dead", dlrk="parking")
    assert (dl.exchange, dl.routing_key, keys) == ("dead", "parking", ["parking"])
    assert dl.route_tail == b"\x04dead\x07parking"
    assert x_death(dl)[0]["exchange"] == "orders"  # the exchange the message was published to
    assert x_death(dl)[0]["routing-keys"] == ["orig"]  # the original keys, not the dead-letter key


def test_default_exchange_is_recorded_as_empty_string() -> None:
    dl, _ = die(publish("q", exchange=""), dlx="")
    assert x_death(dl)[0]["exchange"] == ""
    headers = dl.properties.headers
    assert headers is not None and headers["x-first-death-exchange"] == ""


# ---------------------------------------------------------------------------------------------------
# routing keys


def test_without_dlrk_routes_with_original_key_and_cc() -> None:
    msg = publish("rk", headers={"CC": ["cc1", "cc2"]})
    dl, keys = die(msg, dlrk=None)
    assert keys == ["rk", "cc1", "cc2"]
    assert dl.routing_key == "rk"
    assert x_death(dl)[0]["routing-keys"] == ["rk", "cc1", "cc2"]
    headers = dl.properties.headers
    assert headers is not None and headers["CC"] == ["cc1", "cc2"]


def test_dlrk_replaces_routing_keys_but_x_death_records_original_ones_and_cc_is_kept() -> None:
    # dead_lettering_SUITE:dead_letter_headers_CC_with_routing_key: 3.13+ keeps the CC header
    msg = publish("rk", headers={"CC": ["cc1"]})
    dl, keys = die(msg, dlrk="dlq")
    assert keys == ["dlq"]
    assert x_death(dl)[0]["routing-keys"] == ["rk", "cc1"]
    headers = dl.properties.headers
    assert headers is not None and headers["CC"] == ["cc1"]


def test_empty_dlrk_is_a_routing_key_not_unset() -> None:
    _, keys = die(publish("rk"), dlrk="")
    assert keys == [""]


def test_non_string_cc_values_are_not_routing_keys() -> None:
    _, keys = die(publish("rk", headers={"CC": ["a", 7, b"\xff"]}))
    assert keys == ["rk", "a"]


# ---------------------------------------------------------------------------------------------------
# repeated deaths


def test_same_queue_and_reason_increments_count_and_keeps_first_death_fields() -> None:
    # dead_lettering_SUITE:dead_letter_headers_cycle; mc:update_death bumps only count (and last_time)
    dl1, _ = die(publish("rk", exchange="ex"), queue="q", reason="rejected", dlx="", dlrk="q")
    dl2, _ = die(dl1, queue="q", reason="rejected", now_s=NOW + 60, dlx="", dlrk="q")
    assert x_death(dl2) == [{
        "count": 2, "reason": "rejected", "queue": "q", "time": NOW, "exchange": "ex", "routing-keys": ["rk"],
    }]
    dl3, _ = die(dl2, queue="q", reason="rejected", now_s=NOW + 120, dlx="", dlrk="q")
    assert [d["count"] for d in x_death(dl3)] == [3]


def test_deaths_are_ordered_most_recent_first_and_a_repeat_moves_to_the_front() -> None:
    msg = publish("rk")
    a, _ = die(msg, queue="A", reason="rejected", now_s=NOW, dlx="dlx", dlrk="B")
    b, _ = die(a, queue="B", reason="expired", now_s=NOW + 1, dlx="dlx2", dlrk="A")
    assert [(d["queue"], d["reason"], d["count"]) for d in x_death(b)] == [("B", "expired", 1),
                                                                         ("A", "rejected", 1)]
    # the second death recorded the exchange and key the first dead-lettering published with
    assert (x_death(b)[0]["exchange"], x_death(b)[0]["routing-keys"]) == ("dlx", ["B"])
    a2, _ = die(b, queue="A", reason="rejected", now_s=NOW + 2, dlx="dlx", dlrk="B")
    assert [(d["queue"], d["reason"], d["count"]) for d in x_death(a2)] == [("A", "rejected", 2),
                                                                          ("B", "expired", 1)]
    assert x_death(a2)[0]["time"] == NOW  # time of the first death in A for 'rejected'
    a3, _ = die(a2, queue="A", reason="expired", now_s=NOW + 3, dlx="dlx", dlrk="B")
    assert [(d["queue"], d["reason"], d["count"]) for d in x_death(a3)] == [
        ("A", "expired", 1), ("A", "rejected", 2), ("B", "expired", 1)]
    assert x_death(a3)[0]["time"] == NOW + 3


def test_first_death_headers_are_set_once_and_last_death_headers_every_time() -> None:
    a, _ = die(publish("rk", exchange="ex"), queue="A", reason="rejected", dlx="dlx1", dlrk="B")
    b, _ = die(a, queue="B", reason="maxlen", dlx="dlx2", dlrk="A")
    headers = b.properties.headers
    assert headers is not None
    assert [headers[k] for k in ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")] \
        == ["rejected", "A", "ex"]
    assert [headers[k] for k in ("x-last-death-reason", "x-last-death-queue", "x-last-death-exchange")] \
        == ["maxlen", "B", "dlx1"]
    # each header appears once on the wire (the old values were removed, not shadowed)
    raw = b.properties_raw
    assert raw.count(b"\x13x-last-death-reason") == 1
    assert raw.count(b"\x14x-first-death-reason") == 1
    assert raw.count(b"\x07x-death") == 1


def test_client_supplied_first_and_last_death_headers_are_overwritten_on_first_death() -> None:
    msg = publish("rk", headers={"x-first-death-reason": "forged", "x-last-death-queue": "forged"})
    dl, _ = die(msg, queue="q", reason="expired")
    headers = dl.properties.headers
    assert headers is not None
    assert headers["x-first-death-reason"] == "expired"
    assert headers["x-last-death-queue"] == "q"


# ---------------------------------------------------------------------------------------------------
# expiration, delivery mode, other properties


def test_per_message_expiration_becomes_original_expiration_and_is_removed() -> None:
    # dead_lettering_SUITE:dead_letter_headers_reason_expired_per_message
    dl, _ = die(publish("rk", expiration="1000"), reason="expired")
    assert dl.properties.expiration is None
    entry = x_death(dl)[0]
    assert entry["original-expiration"] == "1000"
    assert list(entry)[0] == "original-expiration"  # mc_amqpl:death_table prepends it
    # the next death (the copy has no expiration any more) records none, the first entry keeps its own
    again, _ = die(dl, queue="dlq", reason="expired")
    assert "original-expiration" not in x_death(again)[0]
    assert x_death(again)[1]["original-expiration"] == "1000"


def test_original_expiration_is_the_parsed_integer() -> None:
    dl, _ = die(publish(expiration="007"))
    assert x_death(dl)[0]["original-expiration"] == "7"


def test_no_expiration_no_original_expiration() -> None:
    dl, _ = die(publish(), reason="maxlen")
    assert "original-expiration" not in x_death(dl)[0]


@pytest.mark.parametrize("mode", [None, 1, 2])
def test_delivery_mode_and_other_properties_and_body_are_kept(mode: int | None) -> None:
    props = dict(content_type="application/json", content_encoding="gzip", delivery_mode=mode,
                 priority=5, correlation_id="c-1", reply_to="replies", message_id="m-1",
                 timestamp=1234567890, type="order", user_id="guest", app_id="app", cluster_id="cl")
    msg = publish("rk", body=b"\x00body\xff", expiration="5", headers={"app": "value"}, **props)
    dl, _ = die(msg, reason="expired")
    assert dl.body == b"\x00body\xff"
    assert dl.size == msg.size
    assert dl.persistent is (mode == 2)
    decoded = wire(dl)
    for name, value in props.items():
        assert getattr(decoded, name) == value, name
    assert decoded.expiration is None
    assert decoded.headers is not None and decoded.headers["app"] == "value"


def test_other_headers_keep_their_wire_types() -> None:
    # re-encoding decoded headers would turn these into 'I'; the copy keeps the publisher's bytes
    msg = publish("rk", headers={"big": TypedInt(5, "l"), "small": TypedInt(-3, "b"), "s": "x"})
    dl, _ = die(msg)
    typed = typed_headers(dl)
    assert typed["big"] == ("l", 5)
    assert typed["small"] == ("b", -3)
    assert typed["s"] == ("S", "x")
    assert dl.properties_raw.startswith(b"\x20\x00")  # only the headers property present


def test_lazy_properties_message_is_handled() -> None:
    raw = BasicProperties(delivery_mode=2, headers={"k": 1}).encode()
    msg = Message("ex", "rk", None, b"b", raw)
    dl, _ = die(msg)
    assert dl.persistent
    assert x_death(dl)[0]["queue"] == "q"


# ---------------------------------------------------------------------------------------------------
# client-supplied x-death


@pytest.mark.parametrize("garbage", ["a string", 42, {"queue": "q"}, b"\x01", None, True])
def test_x_death_that_is_not_an_array_is_replaced(garbage: Any) -> None:
    msg = publish("rk", headers={"x-death": garbage})
    dl, _ = die(msg, queue="q", reason="rejected")
    assert x_death(dl) == [{
        "count": 1, "reason": "rejected", "queue": "q", "time": NOW, "exchange": "ex", "routing-keys": ["rk"],
    }]
    headers = dl.properties.headers
    assert headers is not None and headers["x-first-death-queue"] == "q"


def test_x_death_array_items_that_are_not_usable_tables_are_dropped() -> None:
    garbage = ["text", 7, {"queue": "q2"}, {"reason": "expired"}, {"queue": 1, "reason": "expired"},
               {"queue": "old", "reason": "expired", "count": "many", "time": "noon", "exchange": 3,
                "routing-keys": "rk", "extra": 1},
               {"queue": "old", "reason": "expired", "count": 9}]
    dl, _ = die(publish("rk", headers={"x-death": garbage}), queue="q", reason="maxlen")
    assert x_death(dl) == [
        {"count": 1, "reason": "maxlen", "queue": "q", "time": NOW, "exchange": "ex", "routing-keys": ["rk"]},
        {"count": 1, "reason": "expired", "queue": "old", "time": NOW, "exchange": "", "routing-keys": []},
    ]


def test_well_formed_x_death_is_the_history_it_continues() -> None:
    # Documented deviation from 4.x (which ignores an x-death a client publishes): hutch's history
    # travels in the header, so a republished dead-lettered message continues its counts (3.12).
    first, _ = die(publish("rk"), queue="q", reason="expired")
    republished = publish("rk", headers=first.properties.headers)
    again, _ = die(republished, queue="q", reason="expired", now_s=NOW + 5)
    assert [(d["queue"], d["count"], d["time"]) for d in x_death(again)] == [("q", 2, NOW)]
    headers = again.properties.headers
    assert headers is not None and headers["x-first-death-reason"] == "expired"


def test_huge_client_count_saturates_instead_of_overflowing_a_long() -> None:
    history = [{"queue": "q", "reason": "expired", "count": TypedInt(2**63 - 1, "l"),
                "time": Timestamp(1), "exchange": "", "routing-keys": ["q"]}]
    dl, _ = die(publish("rk", headers={"x-death": history}), queue="q", reason="expired")
    assert typed_headers(dl)["x-death"][1][0][1]["count"] == ("l", 2**63 - 1)


def test_read_deaths_defaults() -> None:
    assert read_deaths({}, NOW) == []
    assert read_deaths({"x-death": []}, NOW) == []
    [death] = read_deaths({"x-death": [{"queue": "q", "reason": "r", "count": 0, "time": -1}]}, NOW)
    assert (death.count, death.time_s, death.exchange, death.routing_keys) == (1, NOW, "", ())


# ---------------------------------------------------------------------------------------------------
# cycles


def test_expired_cycle_a_b_a_is_detected() -> None:
    # A --expired--> B --expired--> A: the message would go round forever (rabbit_dead_letter drops it)
    msg = publish("A", exchange="")
    at_b, keys = die(msg, queue="A", reason="expired", dlx="", dlrk="B")
    assert keys == ["B"]
    assert not is_cycle(at_b, "B")
    assert is_cycle(at_b, "A")  # A itself expired into a route back to A
    back_to_a, _ = die(at_b, queue="B", reason="expired", dlx="", dlrk="A")
    assert is_cycle(back_to_a, "A")
    assert is_cycle(back_to_a, "B")
    assert not is_cycle(back_to_a, "C")
    assert death_queue_names(back_to_a) == ["B", "A"]


def test_a_rejection_in_the_cycle_breaks_it() -> None:
    msg = publish("A", exchange="")
    at_b, _ = die(msg, queue="A", reason="rejected", dlx="", dlrk="B")
    back_to_a, _ = die(at_b, queue="B", reason="expired", dlx="", dlrk="A")
    assert not is_cycle(back_to_a, "A")  # the cycle B(expired), A(rejected) holds a rejection
    assert is_cycle(back_to_a, "B")  # the cycle is just B(expired)


def test_a_rejection_now_is_never_a_cycle() -> None:
    # detect_cycles(rejected, ...) short-cuts; the newest death is the rejection
    msg = publish("A", exchange="")
    at_b, _ = die(msg, queue="A", reason="expired", dlx="", dlrk="B")
    back_to_a, _ = die(at_b, queue="B", reason="rejected", dlx="", dlrk="A")
    assert not is_cycle(back_to_a, "A")
    assert not is_cycle(back_to_a, "B")


def test_only_deaths_newer_than_the_target_queue_count() -> None:
    # deaths: C(expired), A(expired), B(rejected): going to A, the cycle is C, A (no rejection)
    history = [{"queue": "C", "reason": "expired"}, {"queue": "A", "reason": "expired"},
               {"queue": "B", "reason": "rejected"}]
    msg = publish("rk", headers={"x-death": history})
    assert is_cycle(msg, "A")
    assert not is_cycle(msg, "B")


def test_cycle_detection_ignores_messages_without_usable_x_death() -> None:
    assert not is_cycle(publish(), "q")
    assert not is_cycle(publish(headers={"x-death": "q"}), "q")
    # an item that is not a table means a client was involved: not a fully automatic cycle
    assert not is_cycle(publish(headers={"x-death": ["junk", {"queue": "q", "reason": "expired"}]}), "q")
    assert death_queue_names(publish(headers={"x-death": ["junk", {"queue": "q"}]})) == ["q"]


def test_repeated_death_in_a_queue_that_routes_to_itself_is_a_cycle() -> None:
    at_q, _ = die(publish("q", exchange=""), queue="q", reason="maxlen", dlx="", dlrk="q")
    assert is_cycle(at_q, "q")


# ---------------------------------------------------------------------------------------------------
# the wire


def test_x_death_encodes_with_the_types_rabbitmq_clients_expect() -> None:
    msg = publish("rk", headers={"CC": ["cc1"]}, expiration="60000", delivery_mode=2)
    dl, _ = die(msg, queue="q", reason="expired")
    typed = typed_headers(dl)
    letter, entries = typed["x-death"]
    assert letter == "A"
    [(entry_letter, entry)] = entries
    assert entry_letter == "F"
    assert entry == {
        "original-expiration": ("S", "60000"),
        "count": ("l", 1),
        "reason": ("S", "expired"),
        "queue": ("S", "q"),
        "time": ("T", NOW),
        "exchange": ("S", "ex"),
        "routing-keys": ("A", [("S", "rk"), ("S", "cc1")]),
    }
    assert list(entry) == ["original-expiration", "count", "reason", "queue", "time", "exchange",
                           "routing-keys"]
    for key in ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange",
                "x-last-death-reason", "x-last-death-queue", "x-last-death-exchange"):
        assert typed[key][0] == "S", key
    assert typed["CC"] == ("A", [("S", "cc1")])


def test_encoded_properties_round_trip() -> None:
    msg = publish("rk", headers={"CC": ["cc1"], "n": 1}, expiration="10", delivery_mode=2, priority=1)
    dl, _ = die(msg, reason="expired")
    again, _ = die(dl, queue="dlq", reason="rejected", now_s=NOW + 1)
    for m in (dl, again):
        decoded = wire(m)
        assert decoded == m.properties
        assert m.header_payload[12:] == m.properties_raw
        assert struct.unpack_from(">Q", m.header_payload, 4)[0] == len(m.body)
    entries = wire(again).headers["x-death"]  # type: ignore[index]
    assert [(e["queue"], e["reason"], e["count"]) for e in entries] == [("dlq", "rejected", 1),
                                                                        ("q", "expired", 1)]
    assert [type(e["time"]) for e in entries] == [Timestamp, Timestamp]
    assert [e["time"] for e in entries] == [NOW + 1, NOW]


def test_pamqp_reads_the_headers_table() -> None:
    # an independent decoder (pamqp, the codec tests' oracle) accepts the spliced table
    from pamqp import decode as pamqp_decode

    msg = publish("rk", headers={"n": TypedInt(7, "l"), "CC": ["cc1"]}, expiration="10")
    dl, _ = die(msg, reason="expired")
    raw = dl.properties_raw
    consumed, table = pamqp_decode.field_table(raw[2:])
    assert consumed == len(raw) - 2  # the headers table is the only property left
    assert table["n"] == 7 and table["CC"] == ["cc1"]
    [entry] = table["x-death"]
    assert entry["count"] == 1 and entry["routing-keys"] == ["rk", "cc1"]
    assert entry["time"] == datetime.fromtimestamp(NOW, tz=UTC)  # pamqp reads 'T' as a datetime


def test_history_false_starts_the_death_history_afresh() -> None:
    from hutch.amqp.spec import BasicProperties
    from hutch.core.deadletter import dead_letter as _dl
    from hutch.core.message import Message as _M

    forged = [{"count": 7, "reason": "expired", "queue": "q", "exchange": "", "routing-keys": ["q"]}]
    msg = _M("", "q", BasicProperties(headers={"x-death": forged}), b"x")
    new, _keys = _dl(msg, queue="q", reason="expired", now_s=1, dlx="dlx", dlrk=None, history=False)
    deaths = new.properties.headers["x-death"]
    assert len(deaths) == 1 and deaths[0]["count"] == 1
