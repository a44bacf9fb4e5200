"""JSON text with a nesting limit: what the management API decodes from a request body or upload.

Owns: `loads_bounded` (`json.loads` that refuses arrays and objects nested deeper than `MAX_JSON_DEPTH`
with `JsonTooDeep`, checked on the raw text before parsing, so a deeply nested body is a clear 400 and
never a RecursionError out of the recursive C parser) and `json_depth`. Pure; stdlib only.

Rules: the depth scan is linear in the text and does its per-byte work in C (a possessive regular
expression drops the strings, `bytes.translate` keeps the brackets, `accumulate` sums them); it runs only
when the text holds more brackets than the limit, so ordinary bodies pay two `bytes.count` calls.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 64  # arrays and objects inside each other; RabbitMQ's documents need fewer than 10

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)  # possessive: linear, no backtracking
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


class JsonTooDeep(ValueError):
    """A JSON text nested deeper than `MAX_JSON_DEPTH`."""


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings ignored).
    Linear in the text; the per-bracket work runs in C (translate, map, accumulate)."""
    if raw.count(b"[") + raw.count(b"{") == 0:
        return 0
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def loads_bounded(raw: bytes | str) -> Any:
    """`json.loads` that refuses nesting deeper than `MAX_JSON_DEPTH` with `JsonTooDeep` (checked
    before parsing, so the recursive C parser never runs out of stack). ValueError if not JSON."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and json_depth(data) > MAX_JSON_DEPTH:
        raise JsonTooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw)
    except RecursionError:  # not reachable after the depth check; kept as a 400, never a 500
        raise JsonTooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None


__all__ = ["MAX_JSON_DEPTH", "JsonTooDeep", "json_depth", "loads_bounded"]
