"""The rows the `hutch` source produces: the Spark schema and deliveries -> Arrow record batches.

Owns: `READ_SCHEMA` (the fixed schema of every read of a queue), `arrow_read_schema()`, `to_record_batch()`
(a list of deliveries -> one `pyarrow.RecordBatch` in exactly the Arrow schema Spark expects, so the
Python worker hands it to the JVM without converting row by row), the header-value encoding, and the
same for reads of a stream: `STREAM_SCHEMA` (Kafka's columns `key`, `value`, `partition`, `offset`,
`timestamp`, plus hutch's; the rows themselves come from spark/records.py).

Rules:
- The schema is fixed: `value` binary, `exchange`, `routing_key`, `queue` strings, `delivery_tag` long,
  `redelivered` boolean, `timestamp` timestamp, `headers` map<string,string>, `properties` struct of the
  AMQP basic properties (all but headers), `delivery_count` long.
- `timestamp` is the publisher's `timestamp` property when it is set (AMQP gives it in whole seconds),
  else the wall-clock time at which the connector read the delivery from the socket.
- Header values that are not strings are JSON-encoded (numbers, booleans, null, arrays and tables as
  JSON; decimals as JSON strings; timestamps as epoch seconds; byte strings are decoded as UTF-8 with
  invalid bytes backslash-escaped, and kept as text like any other string).
- `delivery_count` is the `x-delivery-count` header when the broker sets it (quorum queues, on
  redelivery), else null.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from hutch.amqp.spec import BasicProperties

if TYPE_CHECKING:
    import pyarrow as pa

    from .client import Delivery

# The AMQP basic properties in the `properties` struct (headers have their own column).
PROPERTY_COLUMNS: tuple[tuple[str, Any], ...] = (
    ("content_type", StringType()),
    ("content_encoding", StringType()),
    ("delivery_mode", IntegerType()),
    ("priority", IntegerType()),
    ("correlation_id", StringType()),
    ("reply_to", StringType()),
    ("expiration", StringType()),
    ("message_id", StringType()),
    ("timestamp", TimestampType()),
    ("type", StringType()),
    ("user_id", StringType()),
    ("app_id", StringType()),
    ("cluster_id", StringType()),
)
PROPERTIES_TYPE = StructType([StructField(name, kind, True) for name, kind in PROPERTY_COLUMNS])

READ_SCHEMA = StructType([
    StructField("value", BinaryType(), True),
    StructField("exchange", StringType(), True),
    StructField("routing_key", StringType(), True),
    StructField("queue", StringType(), True),
    StructField("delivery_tag", LongType(), True),
    StructField("redelivered", BooleanType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("headers", MapType(StringType(), StringType(), True), True),
    StructField("properties", PROPERTIES_TYPE, True),
    StructField("delivery_count", LongType(), True),
])

_NO_PROPERTIES = b"\x00\x00"


@lru_cache(maxsize=1)
def arrow_read_schema() -> pa.Schema:
    """READ_SCHEMA in Arrow, built by the same function Spark's worker uses to check record batches."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(READ_SCHEMA, timezone="UTC")


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    raise TypeError(f"cannot encode {type(value).__name__}")


def header_text(value: Any) -> str:
    """One header value as text: strings as they are, everything else JSON-encoded."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    return json.dumps(value, default=_json_default, separators=(",", ":"))


def _micros(seconds: int) -> int:
    return int(seconds) * 1_000_000


NO_PROPS_ROW = (None,) * len(PROPERTY_COLUMNS)
_CACHE_MAX = 4096


def _decode(raw: bytes, include_headers: bool) -> tuple[int | None, Any, int | None, tuple[Any, ...]]:
    """(publisher timestamp in µs or None, headers as [(key, text)] or None, x-delivery-count or None,
    the 13 property values in PROPERTY_COLUMNS order)."""
    p = BasicProperties.decode(raw, 0)
    ts = None if p.timestamp is None else _micros(p.timestamp)
    headers = None
    count = None
    hdrs = p.headers
    if hdrs:
        c = hdrs.get("x-delivery-count")
        count = c if isinstance(c, int) and not isinstance(c, bool) else None
        if include_headers:
            headers = [(str(k), header_text(v)) for k, v in hdrs.items()]
    row = (p.content_type, p.content_encoding, p.delivery_mode, p.priority, p.correlation_id, p.reply_to,
           p.expiration, p.message_id, ts, p.type, p.user_id, p.app_id, p.cluster_id)
    return ts, headers, count, row


def to_record_batch(deliveries: list[Delivery], queue: str, include_headers: bool) -> pa.RecordBatch:
    """Build one record batch (READ_SCHEMA) from deliveries, in order. Property lists are decoded once
    per distinct encoding in the batch (publishers often send the same properties every time)."""
    import pyarrow as pa

    schema = arrow_read_schema()
    n = len(deliveries)
    timestamps: list[int] = []
    headers_col: list[Any] = []
    props_rows: list[tuple[Any, ...]] = []
    counts: list[int | None] = []
    any_props = False
    cache: dict[bytes, tuple[int | None, Any, int | None, tuple[Any, ...]]] = {}
    for d in deliveries:
        raw = d.properties_raw
        if raw == _NO_PROPERTIES or not raw:
            timestamps.append(d.received_us)
            headers_col.append(None)
            props_rows.append(NO_PROPS_ROW)
            counts.append(None)
            continue
        decoded = cache.get(raw)
        if decoded is None:
            decoded = _decode(raw, include_headers)
            if len(cache) >= _CACHE_MAX:
                cache.clear()
            cache[raw] = decoded
        ts, headers, count, row = decoded
        timestamps.append(d.received_us if ts is None else ts)
        headers_col.append(headers)
        counts.append(count)
        props_rows.append(row)
        any_props = True
    columns = [
        pa.array([d.body for d in deliveries], schema.field("value").type),
        pa.array([d.exchange for d in deliveries], schema.field("exchange").type),
        pa.array([d.routing_key for d in deliveries], schema.field("routing_key").type),
        pa.array([queue] * n, schema.field("queue").type),
        pa.array([d.delivery_tag for d in deliveries], schema.field("delivery_tag").type),
        pa.array([d.redelivered for d in deliveries], schema.field("redelivered").type),
        pa.array(timestamps, pa.int64()).cast(schema.field("timestamp").type),
        pa.array(headers_col, schema.field("headers").type),
        struct_column(props_rows, schema.field("properties").type) if any_props
        else pa.nulls(n, schema.field("properties").type),
        pa.array(counts, schema.field("delivery_count").type),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def struct_column(rows: list[tuple[Any, ...]], kind: pa.DataType) -> pa.Array:
    import pyarrow as pa

    children = []
    for i, values in enumerate(zip(*rows, strict=True)):
        field = kind.field(i)
        if pa.types.is_timestamp(field.type):
            children.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            children.append(pa.array(values, field.type))
    mask = pa.array([row is NO_PROPS_ROW for row in rows], pa.bool_())
    return pa.StructArray.from_arrays(children, fields=list(kind), mask=mask)


def empty_record_batch() -> pa.RecordBatch:
    import pyarrow as pa

    schema = arrow_read_schema()
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


# -- reads of a stream ---------------------------------------------------------------------------------

STREAM_SCHEMA = StructType([
    StructField("key", StringType(), True),
    StructField("value", BinaryType(), True),
    StructField("stream", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("exchange", StringType(), True),
    StructField("headers", MapType(StringType(), StringType(), True), True),
    StructField("properties", PROPERTIES_TYPE, True),
])
OFFSET_HEADER = "x-stream-offset"


@lru_cache(maxsize=1)
def arrow_stream_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(STREAM_SCHEMA, timezone="UTC")

