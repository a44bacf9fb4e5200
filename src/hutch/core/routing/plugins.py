"""The plugin exchange types: x-consistent-hash, x-random, x-local-random, and x-delayed-message's checks.

Part of `hutch.core.routing` (docs/routing.md, "Plugin exchange types"). Pure: randomness comes from a
`random.Random` the router holds (tests seed it), and which queues are local to this node from a predicate
the virtual host sets; no IO, no clock.

- `ConsistentHashRouter`: RabbitMQ's ring. Each binding's routing key is its weight (1..10,000) and takes
  that many consecutive buckets, in binding order; a destination bound twice keeps the buckets of its
  first binding only. A message's bucket is `jump_consistent_hash(value, buckets)` (erlhash.py), where the
  value is the first routing key, or the `hash-header` header, or the `hash-property` property
  (`message_id`, `correlation_id`, `timestamp` in seconds as text). The buckets are kept as cumulative
  weights (one entry per binding), so a heavy weight costs no memory.
- `RandomRouter`: one destination drawn uniformly from the bindings (a destination bound twice is twice
  as likely, as in RabbitMQ).
- `LocalRandomRouter`: one queue drawn among the bound queues local to this node; bindings have an empty
  key and name an existing classic queue (checked by the virtual host, which knows the queues).
"""

from __future__ import annotations

import random
import re
from bisect import bisect_right
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from .bindings import (
    NO_DESTINATIONS,
    Binding,
    Destination,
    Destinations,
    InvalidBinding,
    _BindingTable,
)
from .erlhash import UNDEFINED, Atom, jump_consistent_hash

CONSISTENT_HASH = "x-consistent-hash"
RANDOM = "x-random"
LOCAL_RANDOM = "x-local-random"
DELAYED_MESSAGE = "x-delayed-message"
MAX_BINDING_WEIGHT = 10_000
HASH_PROPERTIES = ("correlation_id", "message_id", "timestamp")
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")


class InvalidExchange(ValueError):
    """exchange.declare arguments the exchange type refuses (406 PRECONDITION_FAILED, RabbitMQ's text)."""


def validate_consistent_hash_exchange(arguments: Mapping[str, Any]) -> None:
    header = arguments.get("hash-header")
    prop = arguments.get("hash-property")
    for name, value in (("hash-header", header), ("hash-property", prop)):
        if value is not None and not isinstance(value, str):
            raise InvalidExchange(f"Invalid argument, '{name}' must be a string")
    if header is not None and prop is not None:
        raise InvalidExchange("hash-header and hash-property are mutually exclusive")
    if prop is not None and prop not in HASH_PROPERTIES:
        raise InvalidExchange(f"Unsupported property: {prop}")


def binding_weight(routing_key: str) -> int:
    """The weight a consistent-hash binding key names; raises InvalidBinding with RabbitMQ's texts."""
    if not _INTEGER.match(routing_key):
        raise InvalidBinding(f'The binding key must be an integer: <<"{routing_key}">>')
    weight = int(routing_key)
    if weight < 1:
        raise InvalidBinding("The binding key must be greater than 0")
    if weight > MAX_BINDING_WEIGHT:
        raise InvalidBinding(f"The binding key must not exceed {MAX_BINDING_WEIGHT}")
    return weight


def validate_local_random_binding(routing_key: str) -> None:
    if routing_key:
        raise InvalidBinding(f"Non empty binding '{routing_key}' key not permitted")


class ConsistentHashRouter(_BindingTable):
    """Bindings on a ring of weighted buckets; each message goes to one destination (module docstring).

    Invariant: `_ring` lists (destination, binding) in binding order, one per destination; `_ends[i]` is
    the total weight of `_ring[:i + 1]`. `_cache` maps a hashed value (bytes, int or atom) to its result,
    at most `cache_entries` of them, and is cleared whenever the ring changes: the jump hash costs tens of
    µs in Python, and partition keys repeat.
    """

    __slots__ = ("_ring", "_ends", "_results", "_cache", "cache_entries", "hash_header", "hash_property")
    uses_routing_key = False

    def __init__(self, cache_entries: int = 4096) -> None:
        super().__init__()
        self._ring: list[tuple[Destination, Binding]] = []
        self._ends: list[int] = []
        self._results: list[Destinations] = []  # one prebuilt result per ring entry
        self._cache: dict[object, Destinations] = {}
        self.cache_entries = cache_entries
        self.hash_header: str | None = None
        self.hash_property: str | None = None

    def configure(self, arguments: Mapping[str, Any]) -> None:
        header = arguments.get("hash-header")
        prop = arguments.get("hash-property")
        self.hash_header = header if isinstance(header, str) else None
        self.hash_property = prop if isinstance(prop, str) and prop in HASH_PROPERTIES else None

    @property
    def buckets(self) -> int:
        return self._ends[-1] if self._ends else 0

    def ring(self) -> list[tuple[int, Destination]]:
        """(first bucket, destination) for every destination on the ring, in bucket order."""
        starts = [0, *self._ends[:-1]]
        return [(start, dest) for start, (dest, _) in zip(starts, self._ring, strict=True)]

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        if not self._ring:
            return NO_DESTINATIONS
        if self.hash_header is not None:
            key: object = _header_term(headers.get(self.hash_header) if headers else None,
                                       headers is not None and self.hash_header in headers)
        elif self.hash_property is not None:
            key = _property_term(self.hash_property, message)
        else:
            key = routing_key.encode("utf-8")
        cacheable = type(key) in (bytes, int, Atom)
        if cacheable:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
        result = self._results[bisect_right(self._ends, jump_consistent_hash(key, self._ends[-1]))]
        if cacheable and self.cache_entries:
            if len(self._cache) >= self.cache_entries:
                del self._cache[next(iter(self._cache))]  # FIFO eviction
            self._cache[key] = result
        return result

    def choose(self, key: object) -> Destination | None:
        """The destination of an Erlang term (as the routing key, header or property would give it)."""
        if not self._ring:
            return None
        return self._ring[bisect_right(self._ends, jump_consistent_hash(key, self._ends[-1]))][0]

    def _index(self, binding: Binding) -> None:
        dest = binding.destination
        if any(d == dest for d, _ in self._ring):
            return  # RabbitMQ: a destination already on the ring keeps its buckets
        weight = _weight_or_one(binding.routing_key)
        self._ring.append((dest, binding))
        self._results.append(Destinations.of((dest,)))
        self._ends.append(self.buckets + weight)
        self._cache.clear()

    def _unindex(self, binding: Binding) -> None:
        index = next((i for i, (_, held) in enumerate(self._ring) if held is binding), None)
        if index is None:
            return  # a second binding to a destination already on the ring
        del self._ring[index]
        del self._results[index]
        self._rebuild_ends()
        self._cache.clear()
        remaining = self._by_dest.get(binding.destination)
        if remaining:  # another binding to the same destination now takes its place, at the end
            self._index(next(iter(remaining.values())))

    def _rebuild_ends(self) -> None:
        total = 0
        ends = []
        for _, held in self._ring:
            total += _weight_or_one(held.routing_key)
            ends.append(total)
        self._ends = ends


def _weight_or_one(routing_key: str) -> int:
    try:
        return binding_weight(routing_key)
    except InvalidBinding:
        return 1  # only a binding restored from a store written before validation can get here


def _header_term(value: Any, present: bool) -> object:
    """The Erlang term RabbitMQ 4.x hashes for a header value (mc_amqpl routing_headers)."""
    if not present or value is None:
        return UNDEFINED
    if isinstance(value, list):  # RabbitMQ hashes the first {Type, Value} of an array
        if not value:
            return []
        first = value[0]
        return [(Atom("longstr"), first.encode("utf-8")) if isinstance(first, str) else _value_term(first)]
    return _value_term(value)


def _value_term(value: Any) -> object:
    if isinstance(value, bool):
        return Atom("true" if value else "false")
    if type(value).__name__ == "Timestamp":
        return int(value) * 1000  # routing headers carry timestamps in milliseconds
    if isinstance(value, (int, float, bytes)):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, Decimal):
        exponent = value.as_tuple().exponent
        scale = -exponent if isinstance(exponent, int) and exponent < 0 else 0
        return (scale, int(value.scaleb(scale)))
    if isinstance(value, Mapping):  # field types are not kept by hutch: hashed as hutch's own term
        return [(key.encode("utf-8"), _value_term(item)) for key, item in value.items()]
    return repr(value).encode("utf-8")


def _property_term(name: str, message: Any) -> object:
    properties = getattr(message, "properties", None)
    value = getattr(properties, name, None) if properties is not None else None
    if value is None:
        return UNDEFINED
    if name == "timestamp":
        return str(int(value)).encode("ascii")
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


class RandomRouter(_BindingTable):
    """One destination drawn uniformly from the bindings (x-random)."""

    __slots__ = ("_choices", "rng")
    uses_routing_key = False

    def __init__(self) -> None:
        super().__init__()
        self._choices: list[Destination] = []
        self.rng = random.Random()

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        choices = self._choices
        if not choices:
            return NO_DESTINATIONS
        return Destinations.of((choices[self.rng.randrange(len(choices))],))

    def _index(self, binding: Binding) -> None:
        self._choices.append(binding.destination)

    def _unindex(self, binding: Binding) -> None:
        self._choices.remove(binding.destination)


class LocalRandomRouter(RandomRouter):
    """One queue drawn among the bound queues that `is_local` accepts (x-local-random)."""

    __slots__ = ("is_local",)

    def __init__(self) -> None:
        super().__init__()
        self.is_local: Callable[[str], bool] = _everywhere

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None,
              message: Any = None) -> Destinations:
        is_local = self.is_local
        local = [dest for dest in self._choices if is_local(dest[1])]
        if not local:
            return NO_DESTINATIONS
        return Destinations.of((local[self.rng.randrange(len(local))] if len(local) > 1 else local[0],))


def _everywhere(name: str) -> bool:
    return True


MAX_DELAY_MS = (1 << 32) - 1  # the plugin's ?ERL_MAX_T: a longer delay is no delay


def message_delay(headers: Mapping[str, Any] | None) -> int | None:
    """The delay in ms an x-delayed-message exchange holds a message for, or None to route it at once.

    As the plugin reads `x-delay`: an integer as is, a float truncated, a string holding an integer
    converted; anything else, a delay of 0 or less (a released message carries its delay negated), or
    more than 2**32 - 1 ms, is no delay.
    """
    if not headers:
        return None
    value = headers.get("x-delay")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        if not _INTEGER.match(value):
            return None
        value = int(value)
    if not isinstance(value, (int, float)):
        return None
    delay = int(value)  # a float is truncated
    return delay if 0 < delay <= MAX_DELAY_MS else None
