"""Plain data out of AMQP values: what the management API and the management agent answer with.

Owns: `jsonable`, which makes AMQP field-table values (bytes, Decimal, timestamps, nested tables and
arrays) into plain data (dict, list, str, int, float, bool, None), JSON- and msgpack-encodable. Pure.
"""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal
from typing import Any


def jsonable(value: Any) -> Any:
    """A JSON-encodable copy of an AMQP value (field tables, arrays, client properties)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, _dt.datetime):
        return int(value.timestamp())
    return str(value)


__all__ = ["jsonable"]
