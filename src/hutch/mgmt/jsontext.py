"""JSON text with a nesting limit: what the management API decodes from a request body or upload.

Owns: `loads_bounded` (orjson's `loads`, which refuses arrays and objects nested deeper than
`MAX_JSON_DEPTH` with `JsonTooDeep`, checked on the raw text before parsing, so a deeply nested body is a
clear 400) and `json_depth`. Pure.

Rules:
- The decoder is orjson (docs/dependencies.md): issue 21 measured a 19.9 MB body at 1.4 s on the loop
  with `json.loads`. Most of that was the cycle collector running over the objects as they were made,
  so the decode runs with the collector paused (JSON makes no cycles; what it makes is freed by
  reference counting): ~0.16 s for 22 MB of small objects on a 2-core machine, against 1.2 s.
- orjson reads integers past 64 bits as floats and refuses escaped lone surrogates, which JSON (and
  RabbitMQ's decoder) keep exact: a body of at most `STDLIB_FALLBACK_BYTES` with a run of 20 digits, or
  that orjson refuses, is decoded with `json.loads` instead (which also keeps the errors' wording).
- The depth scan does its per-byte work in C, one short call at a time: escaped backslashes and quotes
  are removed (`bytes.replace`), everything but brackets and quotes dropped (`bytes.translate`), empty
  quote pairs dropped (what is left of strings without brackets), the rest of the strings' insides split
  away, then innermost bracket pairs are removed one level per pass, at most
  `MAX_JSON_DEPTH` + 1 passes. It runs only when the text holds more brackets than the limit, so
  ordinary bodies pay two `bytes.count` calls.
"""

from __future__ import annotations

import gc
import json
import re
from typing import Any

import orjson

MAX_JSON_DEPTH = 64  # arrays and objects inside each other; RabbitMQ's documents need fewer than 10
STDLIB_FALLBACK_BYTES = 1 << 20
_LONG_NUMBER = re.compile(rb"[0-9]{20}")  # 2**64 has 20 digits

_KEPT = b'[]{}"'
_NOT_KEPT = bytes(b for b in range(256) if b not in _KEPT)
_SAME_KIND = bytes.maketrans(b"{}", b"[]")


class JsonTooDeep(ValueError):
    """A JSON text nested deeper than `MAX_JSON_DEPTH`."""


def json_depth(raw: bytes, limit: int = MAX_JSON_DEPTH) -> int:
    """The deepest nesting of arrays and objects in a JSON text (brackets inside strings ignored), or
    `limit + 1` when it is deeper than `limit`. Linear in the text per level; every step is one C call
    (replace, translate, split), so a worker thread running it lets the event loop take the GIL between
    steps, and no step runs per bracket in Python."""
    if raw.count(b"[") + raw.count(b"{") == 0:
        return 0
    # escapes pair from the left: `\\` first, then what is left of `\"`; other escapes hold no quote
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = unescaped.translate(None, _NOT_KEPT)
    # A bracket is inside a string when an odd number of quotes precede it: dropping two quotes with
    # nothing between them keeps that, and leaves (in one C call, no object per string) only the quotes
    # around strings that hold brackets, which are rare and split away.
    while b'""' in kept:
        kept = kept.replace(b'""', b"")
    outside = b"".join(kept.split(b'"')[::2]) if b'"' in kept else kept
    brackets = outside.translate(_SAME_KIND)  # `{}` as `[]`: depth counts both alike
    depth = 0
    while brackets:
        if depth > limit:
            return depth
        shorter = brackets.replace(b"[]", b"")  # one level of innermost pairs
        if len(shorter) == len(brackets):  # unbalanced brackets: not JSON; count what is open
            return depth + max(brackets.count(b"["), 1)
        brackets = shorter
        depth += 1
    return depth


def loads_bounded(raw: bytes | str) -> Any:
    """Decode a JSON text, refusing nesting deeper than `MAX_JSON_DEPTH` with `JsonTooDeep` (checked
    before parsing). ValueError if not JSON."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH and json_depth(data) > MAX_JSON_DEPTH:
        raise JsonTooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    small = len(data) <= STDLIB_FALLBACK_BYTES
    if not (small and _LONG_NUMBER.search(data)):
        collecting = gc.isenabled()
        gc.disable()  # the collector would walk every object as it is made; JSON makes no cycles
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            if not small:  # a small body is decoded again: json's result, or its familiar error text
                raise ValueError(str(exc)) from None
        finally:
            if collecting:
                gc.enable()
    try:
        return json.loads(raw)
    except RecursionError:  # not reachable after the depth check; kept as a 400, never a 500
        raise JsonTooDeep(f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None


__all__ = ["MAX_JSON_DEPTH", "STDLIB_FALLBACK_BYTES", "JsonTooDeep", "json_depth", "loads_bounded"]
