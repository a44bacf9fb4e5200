"""The headers router: x-match all/any (and -with-x) with bindings compiled and indexed once.

Part of `hutch.core.routing` (see its docstring for the rules).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .bindings import (
    NO_DESTINATIONS,
    X_MATCH_VALUES,
    Binding,
    Destination,
    Destinations,
    InvalidBinding,
    _BindingTable,
    _decimal_parts,
    _epoch_seconds,
    _freeze,
)

_ABSENT = object()
_PRESENT = object()  # pattern value meaning "header present, any value" (a void binding argument)
_TRUE = object()  # booleans never equal numbers in AMQP/Erlang, unlike Python's True == 1
_FALSE = object()


def _match_value(value: Any) -> Any:
    """Map a field value to one whose Python equality is Erlang's `==` on RabbitMQ's decoded term.

    RabbitMQ compares header values, not their field types: ints of any width, timestamps and floats
    compare numerically (1 == 1.0), longstr and byte arrays are both binaries; booleans are atoms.
    """
    kind = type(value)
    if kind is str or kind is float or kind is int:
        return value
    if kind is bool:
        return _TRUE if value else _FALSE
    if isinstance(value, int):  # Timestamp, TypedInt
        return int(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw
    if isinstance(value, Decimal):
        return ("D", _decimal_parts(value))
    if isinstance(value, _dt.datetime):
        return _epoch_seconds(value)
    return _freeze(value)  # nested tables and arrays keep their element types, as in Erlang


@dataclass(frozen=True, slots=True)
class HeadersPattern:
    destination: Destination
    match_all: bool
    items: tuple[tuple[str, Any], ...]  # (header name, _match_value(value) or _PRESENT)


def validate_headers_binding(arguments: Mapping[str, Any] | None) -> None:
    """Refuse an x-match RabbitMQ refuses, with its text; raises InvalidBinding."""
    if not arguments or "x-match" not in arguments:
        return
    x_match = arguments["x-match"]
    if isinstance(x_match, str):
        if x_match not in X_MATCH_VALUES:
            raise InvalidBinding(
                f'Invalid x-match field value <<"{x_match}">>; expected all, any, all-with-x, or any-with-x'
            )
        return
    raise InvalidBinding(
        f"Invalid x-match field type {_erlang_type_name(x_match)} (value {x_match!r}); expected longstr"
    )


def _erlang_type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "long"
    names = {float: "double", bytes: "binary", Decimal: "decimal", dict: "table", list: "array"}
    return "void" if value is None else names.get(type(value), type(value).__name__)


def compile_headers_pattern(binding: Binding) -> HeadersPattern:
    """The binding's arguments as a match plan. An unrecognised x-match means "all" (RabbitMQ legacy)."""
    x_match = binding.arguments.get("x-match")
    with_x = x_match in ("all-with-x", "any-with-x")
    items = tuple(
        (key, _PRESENT if value is None else _match_value(value))
        for key, value in binding.arguments.items()
        if key != "x-match" and (with_x or not key.startswith("x-"))
    )
    return HeadersPattern(binding.destination, x_match not in ("any", "any-with-x"), items)


def _matches(pattern: HeadersPattern, data: Mapping[str, Any]) -> bool:
    """`data` holds header values already passed through `_match_value`."""
    if pattern.match_all:
        for key, wanted in pattern.items:
            got = data.get(key, _ABSENT)
            if got is _ABSENT or (wanted is not _PRESENT and got != wanted):
                return False
        return True
    for key, wanted in pattern.items:
        got = data.get(key, _ABSENT)
        if got is not _ABSENT and (wanted is _PRESENT or got == wanted):
            return True
    return False


_Group = dict[Binding, HeadersPattern]


class HeadersRouter(_BindingTable):
    """Header matching, x-match all | any | all-with-x | any-with-x.

    Each binding is compiled once, at add time, into a `HeadersPattern`, and indexed so that a message
    only evaluates patterns it could match (RabbitMQ scans every binding):
    - an "all" pattern is anchored on one of its items: under (header, value) in `_by_item`, or under
      the header name in `_by_key` when the value is void (presence is enough); with no items it matches
      every message and sits in `_always`;
    - an "any" pattern is anchored on every item; with no items it never matches and is not indexed.
    Per message only headers some binding names are normalised (`_key_uses`), so a large x-death array
    costs nothing unless a binding asks for it.
    """

    __slots__ = ("_patterns", "_key_uses", "_always", "_by_key", "_by_item")
    uses_routing_key = False

    def __init__(self) -> None:
        super().__init__()
        self._patterns: _Group = {}
        self._key_uses: dict[str, int] = {}
        self._always: _Group = {}
        self._by_key: dict[str, _Group] = {}
        self._by_item: dict[tuple[str, Hashable], _Group] = {}

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        if not self._patterns:
            return NO_DESTINATIONS
        used = self._key_uses
        data = {key: _match_value(value) for key, value in headers.items() if key in used} if headers else {}
        matched: set[Destination] = set()
        _collect(self._always, data, matched)
        for key, value in data.items():
            group = self._by_key.get(key)
            if group:
                _collect(group, data, matched)
            group = self._by_item.get((key, value))
            if group:
                _collect(group, data, matched)
        return Destinations.of(matched) if matched else NO_DESTINATIONS

    def _index(self, binding: Binding) -> None:
        pattern = self._patterns[binding] = compile_headers_pattern(binding)
        for key, _ in pattern.items:
            self._key_uses[key] = self._key_uses.get(key, 0) + 1
        if not pattern.items and pattern.match_all:
            self._always[binding] = pattern
        for index, anchor in self._anchors(pattern):
            group = index.get(anchor)
            if group is None:
                group = index[anchor] = {}
            group[binding] = pattern

    def _unindex(self, binding: Binding) -> None:
        pattern = self._patterns.pop(binding)
        for key, _ in pattern.items:
            left = self._key_uses[key] - 1
            if left:
                self._key_uses[key] = left
            else:
                del self._key_uses[key]
        self._always.pop(binding, None)
        for index, anchor in self._anchors(pattern):
            group = index[anchor]
            del group[binding]
            if not group:
                del index[anchor]

    def _anchors(self, pattern: HeadersPattern) -> list[tuple[dict[Any, _Group], Hashable]]:
        """Where the pattern is indexed: (self._by_key, header) or (self._by_item, (header, value))."""
        items = pattern.items
        if pattern.match_all and items:  # one anchor is enough; a valued item is the more selective
            items = tuple([item for item in items if item[1] is not _PRESENT][:1]) or items[:1]
        by_key: dict[Any, _Group] = self._by_key
        by_item: dict[Any, _Group] = self._by_item
        return [(by_key, key) if wanted is _PRESENT else (by_item, (key, wanted)) for key, wanted in items]


def _collect(group: _Group, data: Mapping[str, Any], matched: set[Destination]) -> None:
    for pattern in group.values():
        if pattern.destination not in matched and _matches(pattern, data):
            matched.add(pattern.destination)


# ---------------------------------------------------------------------------------------------------
# Exchanges and the routing walk

