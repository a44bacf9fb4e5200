"""What both sinks share: the checks of a written DataFrame's common columns and the row → AMQP
properties conversion.

Owns: `check_value_and_headers` and `check_properties` (the `value`, `headers` and `properties` columns,
the same for a write to an exchange and to a stream), `apply_properties` / `header_value` (a row's
`properties` struct and `headers` map as AMQP 0-9-1 properties), `HutchCommitMessage` (what one task
published) and `HutchWriteError`.

Pure of IO; the column checks run on the driver when a write starts, the conversion on executors.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from hutch.amqp.spec import BasicProperties

from .options import HutchOptionError

_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_HEADER_VALUE_TYPES = (StringType, BinaryType, BooleanType, DoubleType, FloatType, TimestampType,
                       TimestampNTZType, *_INTEGRAL)
STRING_PROPERTIES = ("content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
                     "message_id", "type", "user_id", "app_id", "cluster_id")
OCTET_PROPERTIES = ("delivery_mode", "priority")


class HutchWriteError(RuntimeError):
    """Publishing failed: the task did not get a positive confirm for every message."""


@dataclass
class HutchCommitMessage(WriterCommitMessage):
    """What one task published: every message was confirmed by the broker."""

    partition_id: int
    messages: int
    first_message_id: str | None
    last_message_id: str | None


def type_name(kind: DataType) -> str:
    return kind.simpleString()


def columns_checked(schema: StructType, allowed: tuple[str, ...], ignored: tuple[str, ...],
                    described: str) -> dict[str, DataType]:
    """The DataFrame's columns by lower-case name, once `value` and `headers` are right and every
    column is `allowed` or `ignored` (else HutchOptionError, with `described`: what a write takes)."""
    by_name = {field.name.lower(): field.dataType for field in schema.fields}
    check_value_and_headers(by_name)
    for field in schema.fields:
        name = field.name.lower()
        if name not in allowed and name not in ignored:
            raise HutchOptionError(f"hutch sink: unexpected column {field.name!r}; {described}, and may keep "
                                   f"the other columns of a hutch read ({', '.join(ignored)}), which are "
                                   "ignored; select or drop the others")
    return by_name


def check_value_and_headers(by_name: dict[str, DataType]) -> None:
    """The `value` column (required: binary or string) and the `headers` column (a map with string keys)."""
    value = by_name.get("value")
    if value is None:
        raise HutchOptionError("hutch sink: the DataFrame needs a 'value' column (binary or string): the "
                               "message body")
    if not isinstance(value, (BinaryType, StringType)):
        raise HutchOptionError(f"hutch sink: column 'value' must be binary or string, got {type_name(value)}")
    headers = by_name.get("headers")
    if headers is not None and not (isinstance(headers, MapType) and isinstance(headers.keyType, StringType)
                                    and isinstance(headers.valueType, _HEADER_VALUE_TYPES)):
        raise HutchOptionError(
            f"hutch sink: column 'headers' must be a map with string keys and string, binary, boolean, "
            f"integer or floating-point values, got {type_name(headers)}")


def check_properties(kind: DataType) -> None:
    """The `properties` column: a struct of AMQP property fields of the right types."""
    if not isinstance(kind, StructType):
        raise HutchOptionError(f"hutch sink: column 'properties' must be a struct, got {type_name(kind)}")
    for field in kind.fields:
        name = field.name
        t = field.dataType
        if name in STRING_PROPERTIES:
            ok = isinstance(t, StringType)
            want = "string"
        elif name in OCTET_PROPERTIES:
            ok = isinstance(t, _INTEGRAL)
            want = "an integer type"
        elif name == "timestamp":
            ok = isinstance(t, (TimestampType, TimestampNTZType, LongType, IntegerType))
            want = "timestamp or long (epoch seconds)"
        else:
            allowed = ", ".join((*STRING_PROPERTIES, *OCTET_PROPERTIES, "timestamp"))
            raise HutchOptionError(f"hutch sink: unknown field 'properties.{name}' (AMQP properties: "
                                   f"{allowed}; headers have their own column)")
        if not ok:
            raise HutchOptionError(f"hutch sink: field 'properties.{name}' must be {want}, got {type_name(t)}")


def _epoch_seconds(value: Any) -> int:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp())
    return int(value)


def header_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return value


def apply_properties(p: BasicProperties, row: dict[str, Any]) -> None:
    """Set the non-null fields of a row's `properties` struct on `p`."""
    for name, value in row.items():
        if value is None:
            continue
        if name == "timestamp":
            p.timestamp = _epoch_seconds(value)
        elif name in OCTET_PROPERTIES:
            setattr(p, name, int(value))
        else:
            setattr(p, name, value)


__all__ = ["HutchCommitMessage", "HutchWriteError", "apply_properties", "check_properties", "columns_checked",
           "check_value_and_headers", "header_value"]
