"""Where a stream reader starts: offset specs and their parsing from AMQP 0-9-1 arguments.

Owns: `OffsetSpec` (first, last, next, an offset, a timestamp) and `parse_amqp`, which reads
`x-stream-offset` as RabbitMQ does: "first", "last", "next", a non-negative integer offset, an AMQP
timestamp (field type T: seconds since the epoch), or an interval string such as "30m" or "7D" (a timestamp that far
back from now; units Y M D h m s as RabbitMQ's `x-max-age`). Anything else is refused.

Resolution (against a log's first, next and last chunk, `hutch.runtime.queue_types.stream.handle`):
first → the first chunk; last → the last user chunk; next → the next offset to be written; an offset
below the first → the first; past the end → next; a timestamp → the first chunk at or after it (next if
none is).
"""

from __future__ import annotations

import datetime
import enum
import re
from dataclasses import dataclass

from hutch.amqp.table import Timestamp


class SpecKind(enum.Enum):
    FIRST = "first"
    LAST = "last"
    NEXT = "next"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"


@dataclass(frozen=True)
class OffsetSpec:
    kind: SpecKind
    value: int = 0  # the offset, or the timestamp in ms

    @classmethod
    def first(cls) -> OffsetSpec:
        return cls(SpecKind.FIRST)

    @classmethod
    def last(cls) -> OffsetSpec:
        return cls(SpecKind.LAST)

    @classmethod
    def next(cls) -> OffsetSpec:
        return cls(SpecKind.NEXT)

    @classmethod
    def offset(cls, offset: int) -> OffsetSpec:
        if offset < 0:
            raise ValueError(f"an offset is not negative: {offset}")
        return cls(SpecKind.OFFSET, offset)

    @classmethod
    def timestamp(cls, ms: int) -> OffsetSpec:
        return cls(SpecKind.TIMESTAMP, ms)


_UNITS_MS = {"Y": 365 * 86_400_000, "M": 30 * 86_400_000, "D": 86_400_000, "h": 3_600_000,
             "m": 60_000, "s": 1000}
_INTERVAL = re.compile(r"^([0-9]+)([YMDhms])$")


def interval_ms(text: str) -> int | None:
    """"7D", "12h", "30m", "10s"… in ms (RabbitMQ's x-max-age and x-stream-offset intervals), else None."""
    m = _INTERVAL.match(text)
    if m is None:
        return None
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def parse_amqp(value: object, now_ms: int) -> OffsetSpec:
    """The spec an `x-stream-offset` consume argument names; ValueError if it names none."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, bool):
        raise ValueError(f"invalid offset spec {value!r}")
    if isinstance(value, Timestamp):  # a field-table timestamp: seconds
        return OffsetSpec.timestamp(int(value) * 1000)
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid offset {value}")
        return OffsetSpec.offset(value)
    if isinstance(value, datetime.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return OffsetSpec.timestamp(int(when.timestamp() * 1000))
    if isinstance(value, str):
        if value in ("first", "last", "next"):
            return OffsetSpec(SpecKind(value))
        ms = interval_ms(value)
        if ms is not None:
            return OffsetSpec.timestamp(now_ms - ms)
    raise ValueError(f"invalid offset spec {value!r}")
