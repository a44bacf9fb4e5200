"""Bindings, destinations, the Router protocol and the direct and fanout routers.

Part of `hutch.core.routing` (see its docstring for the rules).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import quote_plus

QUEUE = "queue"
EXCHANGE = "exchange"
Destination = tuple[str, str]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers", "x-consistent-hash", "x-random", "x-local-random",
                  "x-delayed-message")
DEFAULT_EXCHANGE = ""
X_MATCH_VALUES = ("all", "any", "all-with-x", "any-with-x")
TOPIC_ROUTE_CACHE_ENTRIES = 4096


class UnknownExchangeType(ValueError):
    """exchange.declare named a type hutch does not implement (406 PRECONDITION_FAILED in RabbitMQ 4.x)."""

    def __init__(self, exchange_type: str) -> None:
        super().__init__(f"unknown exchange type '{exchange_type}'")
        self.exchange_type = exchange_type


class InvalidBinding(ValueError):
    """Binding arguments the exchange type refuses (406 PRECONDITION_FAILED, RabbitMQ's wording)."""


def queue_dest(name: str) -> Destination:
    return (QUEUE, name)


def exchange_dest(name: str) -> Destination:
    return (EXCHANGE, name)


# ---------------------------------------------------------------------------------------------------
# Argument canonicalisation


def freeze_arguments(arguments: Mapping[str, Any] | None) -> Hashable:
    """Canonical, hashable, order-independent form of a field table, for binding identity.

    Type-aware: True, 1 and 1.0 are three different argument values (RabbitMQ keeps the field type).
    """
    if not arguments:
        return ()
    return tuple(sorted((key, _freeze(value)) for key, value in arguments.items()))


def _freeze(value: Any) -> Hashable:
    if isinstance(value, bool):
        return ("t", value)
    if isinstance(value, int):
        return ("T" if type(value).__name__ == "Timestamp" else "i", int(value))
    if isinstance(value, float):
        return ("d", value.hex())
    if isinstance(value, str):
        return ("S", value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("x", bytes(value))
    if value is None:
        return ("V",)
    if isinstance(value, Mapping):
        return ("F", freeze_arguments(value))
    if isinstance(value, (list, tuple)):
        return ("A", tuple(_freeze(item) for item in value))
    if isinstance(value, Decimal):
        return ("D", _decimal_parts(value))
    if isinstance(value, _dt.datetime):
        return ("T", _epoch_seconds(value))
    return ("?", type(value).__qualname__, repr(value))


def _decimal_parts(value: Decimal) -> tuple[int, int] | str:
    """(scale, unscaled) as AMQP carries a decimal (and as RabbitMQ compares it)."""
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):  # NaN / Infinity cannot come off the wire
        return str(value)
    scale = -exponent if exponent < 0 else 0
    return (scale, int(value.scaleb(scale)))


def _epoch_seconds(value: _dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=_dt.UTC)
    return int(value.timestamp())


# ---------------------------------------------------------------------------------------------------
# Bindings


@dataclass(eq=False, slots=True)
class Binding:
    """One binding of `source` (an exchange name) to a queue or exchange.

    Invariant: `arguments` is not mutated after construction; `arguments_key` is its frozen form and is
    what binding identity uses.
    """

    source: str
    destination: Destination
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    arguments_key: Hashable = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.arguments is None:  # tolerated: callers holding an absent field table
            self.arguments = {}
        self.arguments_key = freeze_arguments(self.arguments)

    @property
    def properties_key(self) -> str:
        """RabbitMQ management's `properties_key`: names this binding in /api/bindings URLs.

        "~" for an empty key without arguments; the quoted key without arguments; otherwise
        quoted key + "~" + a 6-character hash of the arguments (RabbitMQ uses erlang:phash2, which
        we cannot reproduce; ours is the first 4 bytes of a SHA-256, base64url, so stable across nodes).
        """
        if not self.arguments:
            return "~" if self.routing_key == "" else _quote_binding(self.routing_key)
        return _quote_binding(self.routing_key) + "~" + _quote_binding(arguments_hash(self.arguments))


def arguments_hash(arguments: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(repr(freeze_arguments(arguments)).encode("utf-8")).digest()[:4]
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def _quote_binding(text: str) -> str:
    # mochiweb's quote_plus keeps [A-Za-z0-9._~-], then RabbitMQ escapes "~" so it can be the separator.
    return quote_plus(text, safe="").replace("~", "%7E")


# ---------------------------------------------------------------------------------------------------
# Route results


class Destinations(frozenset[Destination]):
    """An immutable set of destinations with its queue and exchange names split out in advance.

    Routers return these so that `route()` needs no per-message pass to tell queues from exchanges.
    """

    __slots__ = ("queues", "exchanges")
    queues: frozenset[str]
    exchanges: tuple[str, ...]

    @classmethod
    def of(cls, destinations: Iterable[Destination]) -> Destinations:
        result = cls(destinations)
        queues = frozenset([name for kind, name in result if kind == QUEUE])
        result.queues = queues
        result.exchanges = (
            () if len(queues) == len(result) else tuple([name for kind, name in result if kind == EXCHANGE])
        )
        return result


NO_DESTINATIONS = Destinations.of(())


@runtime_checkable
class Router(Protocol):
    """The bindings of one exchange, indexed for its type's matching rule."""

    def add(self, binding: Binding) -> bool: ...

    def remove(self, destination: Destination, routing_key: str, arguments: Mapping[str, Any] | None) -> bool: ...

    def remove_destination(self, destination: Destination) -> list[Binding]: ...

    def route(self, routing_key: str, headers: Mapping[str, Any] | None,
              message: Any = None) -> Collection[Destination]: ...

    def bindings(self) -> list[Binding]: ...

    def __len__(self) -> int: ...


class _BindingTable:
    """Binding bookkeeping shared by every router: identity, duplicates, removal by destination.

    Invariant: `_by_dest[d][(key, arguments_key)]` holds every binding to d exactly once, and
    `_count` is the total; subclasses index each binding once in `_index` and drop it in `_unindex`.
    """

    __slots__ = ("_by_dest", "_count")
    uses_routing_key: ClassVar[bool] = True

    def __init__(self) -> None:
        self._by_dest: dict[Destination, dict[tuple[str, Hashable], Binding]] = {}
        self._count = 0

    def add(self, binding: Binding) -> bool:
        per_dest = self._by_dest.get(binding.destination)
        if per_dest is None:
            per_dest = self._by_dest[binding.destination] = {}
        ident = (binding.routing_key, binding.arguments_key)
        if ident in per_dest:
            return False
        per_dest[ident] = binding
        self._count += 1
        self._index(binding)
        return True

    def remove(self, destination: Destination, routing_key: str, arguments: Mapping[str, Any] | None) -> bool:
        per_dest = self._by_dest.get(destination)
        if per_dest is None:
            return False
        binding = per_dest.pop((routing_key, freeze_arguments(arguments)), None)
        if binding is None:
            return False
        if not per_dest:
            del self._by_dest[destination]
        self._count -= 1
        self._unindex(binding)
        return True

    def remove_destination(self, destination: Destination) -> list[Binding]:
        per_dest = self._by_dest.pop(destination, None)
        if per_dest is None:
            return []
        removed = list(per_dest.values())
        self._count -= len(removed)
        for binding in removed:
            self._unindex(binding)
        return removed

    def bindings(self) -> list[Binding]:
        return [binding for per_dest in self._by_dest.values() for binding in per_dest.values()]

    def __len__(self) -> int:
        return self._count

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Collection[Destination]:
        raise NotImplementedError

    def _index(self, binding: Binding) -> None:
        raise NotImplementedError

    def _unindex(self, binding: Binding) -> None:
        raise NotImplementedError


def _incr(counts: dict[Destination, int], destination: Destination) -> None:
    counts[destination] = counts.get(destination, 0) + 1


def _decr(counts: dict[Destination, int], destination: Destination) -> None:
    left = counts[destination] - 1
    if left:
        counts[destination] = left
    else:
        del counts[destination]


# ---------------------------------------------------------------------------------------------------
# direct and fanout


class DirectRouter(_BindingTable):
    """Exact routing-key match. route() is one dict lookup returning a cached `Destinations`.

    `_counts[key][dest]` counts the bindings (differing only in arguments) of dest under key; `_routes`
    caches the result per key and is rebuilt lazily, so binding many queues to one key stays linear.
    """

    __slots__ = ("_counts", "_routes")

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[str, dict[Destination, int]] = {}
        self._routes: dict[str, Destinations] = {}

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        cached = self._routes.get(routing_key)
        if cached is not None:
            return cached
        counts = self._counts.get(routing_key)
        if counts is None:
            return NO_DESTINATIONS
        cached = self._routes[routing_key] = Destinations.of(counts)
        return cached

    def _index(self, binding: Binding) -> None:
        counts = self._counts.get(binding.routing_key)
        if counts is None:
            counts = self._counts[binding.routing_key] = {}
        _incr(counts, binding.destination)
        self._routes.pop(binding.routing_key, None)

    def _unindex(self, binding: Binding) -> None:
        counts = self._counts[binding.routing_key]
        _decr(counts, binding.destination)
        if not counts:
            del self._counts[binding.routing_key]
        self._routes.pop(binding.routing_key, None)


class FanoutRouter(_BindingTable):
    """Every destination, whatever the routing key."""

    __slots__ = ("_counts", "_route")
    uses_routing_key = False

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[Destination, int] = {}
        self._route: Destinations | None = NO_DESTINATIONS

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        cached = self._route
        if cached is None:
            cached = self._route = Destinations.of(self._counts)
        return cached

    def _index(self, binding: Binding) -> None:
        _incr(self._counts, binding.destination)
        self._route = None

    def _unindex(self, binding: Binding) -> None:
        _decr(self._counts, binding.destination)
        self._route = None


# ---------------------------------------------------------------------------------------------------
# topic


