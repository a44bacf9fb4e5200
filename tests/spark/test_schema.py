"""Deliveries -> Arrow rows (no JVM): the schema Spark expects, properties, headers, timestamps."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from hutch.amqp.spec import BasicProperties
from hutch.amqp.table import Timestamp
from hutch.spark.client import Delivery
from hutch.spark.schema import READ_SCHEMA, arrow_read_schema, header_text, to_record_batch


def _d(tag: int, props: BasicProperties | None = None, body: bytes = b"b") -> Delivery:
    raw = props.encode() if props is not None else b"\x00\x00"
    return Delivery(tag, tag % 2 == 0, "orders-x", "eu.new", raw, body, 1_700_000_000_123_456)


def test_schema_columns() -> None:
    assert READ_SCHEMA.fieldNames() == ["value", "exchange", "routing_key", "queue", "delivery_tag",
                                        "redelivered", "timestamp", "headers", "properties", "delivery_count"]
    assert READ_SCHEMA["properties"].dataType.fieldNames()[:3] == ["content_type", "content_encoding",
                                                                    "delivery_mode"]


def test_rows_without_properties() -> None:
    rb = to_record_batch([_d(1), _d(2)], "orders", True)
    assert rb.schema.equals(arrow_read_schema())
    row = rb.to_pylist()[1]
    assert row["value"] == b"b" and row["queue"] == "orders" and row["exchange"] == "orders-x"
    assert row["delivery_tag"] == 2 and row["redelivered"] is True
    assert row["headers"] is None and row["properties"] is None and row["delivery_count"] is None
    # no publisher timestamp: the time the connector read the delivery
    assert row["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC)


def test_properties_headers_and_delivery_count() -> None:
    props = BasicProperties(content_type="application/json", delivery_mode=2, priority=5, message_id="o-1",
                            correlation_id="c", timestamp=1_600_000_000, app_id="shop",
                            headers={"region": "eu", "n": 3, "ok": True, "price": Decimal("9.99"),
                                     "tags": ["a", 1], "nested": {"k": None}, "raw": b"\xffab",
                                     "at": Timestamp(5), "x-delivery-count": 2})
    (row,) = to_record_batch([_d(1, props)], "q", True).to_pylist()
    p = row["properties"]
    assert (p["content_type"], p["delivery_mode"], p["priority"], p["message_id"], p["app_id"]) == (
        "application/json", 2, 5, "o-1", "shop")
    assert p["timestamp"] == dt.datetime(2020, 9, 13, 12, 26, 40, tzinfo=dt.UTC)
    assert row["timestamp"] == p["timestamp"], "the publisher's timestamp wins"
    assert dict(row["headers"]) == {"region": "eu", "n": "3", "ok": "true", "price": '"9.99"',
                                    "tags": '["a",1]', "nested": '{"k":null}', "raw": "\\xffab", "at": "5",
                                    "x-delivery-count": "2"}
    assert row["delivery_count"] == 2


def test_include_headers_false_keeps_delivery_count() -> None:
    props = BasicProperties(headers={"x-delivery-count": 4, "a": "b"})
    (row,) = to_record_batch([_d(1, props)], "q", False).to_pylist()
    assert row["headers"] is None and row["delivery_count"] == 4


def test_header_text() -> None:
    assert header_text("plain") == "plain"
    assert header_text(None) == "null"
    assert header_text(1.5) == "1.5"
    assert header_text(dt.datetime(2024, 1, 2, tzinfo=dt.UTC)) == '"2024-01-02T00:00:00+00:00"'
