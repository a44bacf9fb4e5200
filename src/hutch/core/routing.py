"""Exchange routing: bindings, the four standard exchange types, and the publish-time graph walk.

Owns: the `Binding` and `Exchange` records, one `Router` per exchange type (direct, fanout, topic,
headers) that indexes an exchange's bindings, and `route()`, which turns (exchange, routing keys,
headers) into the set of queue names a message reaches, following exchange-to-exchange bindings and
alternate exchanges. Pure and synchronous: no IO, no clocks, no asyncio. Queue existence, permissions,
`internal` and `mandatory` are the caller's business.

Rules (RabbitMQ 4.x semantics; docs/routing.md explains each decision):
- A destination is the tuple (kind, name) with kind `QUEUE` or `EXCHANGE`.
- A binding is identified by (destination, routing_key, arguments); adding an identical one is a no-op.
  Direct, fanout and topic routers ignore binding arguments when matching, but a destination bound twice
  with different arguments holds two bindings, and stays routed until both are removed.
- `Router.route` results are immutable and may be shared between calls: never mutate them.
- The default exchange ("") routes to the queue named by each routing key; that is done in `route()`,
  so its router stays empty. Reached as an alternate exchange it routes nowhere, as in RabbitMQ 4.x.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar, Protocol, runtime_checkable
from urllib.parse import quote_plus

QUEUE = "queue"
EXCHANGE = "exchange"
Destination = tuple[str, str]

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
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

    def route(self, routing_key: str, headers: Mapping[str, Any] | None) -> Collection[Destination]: ...

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

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Destinations:
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

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Destinations:
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


def split_topic_key(key: str) -> list[str]:
    """Words of a routing or binding key, as RabbitMQ splits them: "" has no words, "a..b" three."""
    return key.split(".") if key else []


class _TrieNode:
    """One word position in the topic trie.

    Invariants: a non-root node has bindings or children; `hash_child is children.get("#")`.
    """

    __slots__ = ("children", "hash_child", "counts", "parent", "word", "is_hash", "cached")

    def __init__(self, parent: _TrieNode | None, word: str) -> None:
        self.children: dict[str, _TrieNode] = {}
        self.hash_child: _TrieNode | None = None
        self.counts: dict[Destination, int] = {}
        self.parent = parent
        self.word = word
        self.is_hash = word == "#"
        self.cached: Destinations | None = None

    def destinations(self) -> Destinations:
        cached = self.cached
        if cached is None:
            cached = self.cached = Destinations.of(self.counts)
        return cached


def _with_hash_chains(nodes: Iterable[_TrieNode]) -> dict[_TrieNode, None]:
    """The nodes plus the chain of "#" children below each ("#" may match zero words), deduplicated."""
    closed: dict[_TrieNode, None] = {}
    for node in nodes:
        closed[node] = None
        chained = node.hash_child
        while chained is not None and chained not in closed:
            closed[chained] = None
            chained = chained.hash_child
    return closed


class TopicRouter(_BindingTable):
    """Topic matching with a word trie whose edges are literal words, "*" and "#".

    Matching simulates the trie as an NFA: the active node set advances one routing-key word at a time
    (literal child, "*" child, and a "#" node may stay where it is), so cost is O(words x active nodes)
    whatever the number of bindings, and "#.#.#" patterns cannot blow up exponentially. Results are
    memoised per routing key in a bounded FIFO cache that any add or remove clears.
    """

    __slots__ = ("_root", "_cache", "_cache_entries")

    def __init__(self, cache_entries: int = TOPIC_ROUTE_CACHE_ENTRIES) -> None:
        super().__init__()
        self._root = _TrieNode(None, "")
        self._cache: dict[str, Destinations] = {}
        self._cache_entries = cache_entries

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Destinations:
        cache = self._cache
        cached = cache.get(routing_key)
        if cached is not None:
            return cached
        result = self._match(split_topic_key(routing_key))
        if self._cache_entries:
            if len(cache) >= self._cache_entries:
                del cache[next(iter(cache))]
            cache[routing_key] = result
        return result

    def _match(self, words: list[str]) -> Destinations:
        root = self._root
        active: Iterable[_TrieNode] = _with_hash_chains((root,)) if root.hash_child else (root,)
        for word in words:
            following: list[_TrieNode] = []
            # A literal "*" or "#" word in the key would find the same child as the wildcard rules.
            literal = word != "*" and word != "#"
            for node in active:
                if node.is_hash:
                    following.append(node)
                children = node.children
                if children:
                    if literal:
                        child = children.get(word)
                        if child is not None:
                            following.append(child)
                    child = children.get("*")
                    if child is not None:
                        following.append(child)
            if not following:
                return NO_DESTINATIONS
            active = _with_hash_chains(following)
        matched = [node.destinations() for node in active if node.counts]
        if len(matched) == 1:
            return matched[0]
        return Destinations.of(frozenset().union(*matched)) if matched else NO_DESTINATIONS

    def _index(self, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _TrieNode(node, word)
                if child.is_hash:
                    node.hash_child = child
            node = child
        _incr(node.counts, binding.destination)
        node.cached = None
        self._cache.clear()

    def _unindex(self, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            node = node.children[word]
        _decr(node.counts, binding.destination)
        node.cached = None
        self._cache.clear()
        parent = node.parent
        while parent is not None and not node.counts and not node.children:
            del parent.children[node.word]
            if node.is_hash:
                parent.hash_child = None
            node, parent = parent, parent.parent

    def node_count(self) -> int:
        """Trie nodes below the root (for tests: removal must prune)."""
        stack, count = [self._root], 0
        while stack:
            children = stack.pop().children.values()
            count += len(children)
            stack.extend(children)
        return count


# ---------------------------------------------------------------------------------------------------
# headers

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

    def route(self, routing_key: str, headers: Mapping[str, Any] | None = None) -> Destinations:
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
            items = ([item for item in items if item[1] is not _PRESENT] or list(items))[:1]
        by_key: dict[Any, _Group] = self._by_key
        by_item: dict[Any, _Group] = self._by_item
        return [(by_key, key) if wanted is _PRESENT else (by_item, (key, wanted)) for key, wanted in items]


def _collect(group: _Group, data: Mapping[str, Any], matched: set[Destination]) -> None:
    for pattern in group.values():
        if pattern.destination not in matched and _matches(pattern, data):
            matched.add(pattern.destination)


# ---------------------------------------------------------------------------------------------------
# Exchanges and the routing walk

_ROUTER_TYPES: dict[str, type[_BindingTable]] = {
    "direct": DirectRouter,
    "fanout": FanoutRouter,
    "topic": TopicRouter,
    "headers": HeadersRouter,
}


def make_router(exchange_type: str) -> Router:
    router_type = _ROUTER_TYPES.get(exchange_type)
    if router_type is None:
        raise UnknownExchangeType(exchange_type)
    return router_type()


def validate_binding(exchange_type: str, arguments: Mapping[str, Any] | None) -> None:
    """Exchange-type checks on bind arguments (only headers has any); raises InvalidBinding."""
    if exchange_type == "headers":
        validate_headers_binding(arguments)


@dataclass(eq=False, slots=True)
class Exchange:
    """An exchange and its bindings (in `router`, built from `type`).

    `alternate_exchange` starts from arguments["alternate-exchange"]; a policy may overwrite it.
    """

    vhost: str
    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)
    router: Router = field(init=False, repr=False)
    alternate_exchange: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.router = make_router(self.type)
        alternate = self.arguments.get("alternate-exchange")
        self.alternate_exchange = alternate if isinstance(alternate, str) else None


def route(
    exchanges: Mapping[str, Exchange],
    exchange: Exchange,
    routing_keys: Sequence[str],
    headers: Mapping[str, Any] | None,
) -> set[str]:
    """Return the set of QUEUE names the message reaches.

    Follows exchange-to-exchange bindings (each exchange visited once, so cycles terminate); for every
    exchange that routes the message nowhere, tries its alternate_exchange if it exists in `exchanges`
    (also cycle-safe). `routing_keys` has more than one element when the publisher used CC/BCC headers:
    the message is routed with each key and the union taken. Queue names are returned even if the queue
    does not exist; the caller filters.
    """
    if not exchange.name:  # the default exchange: implicit bindings to every queue
        return set(routing_keys)
    if len(routing_keys) == 1:
        first = exchange.router.route(routing_keys[0], headers)
        if type(first) is Destinations and first.queues and not first.exchanges:
            return set(first.queues)  # hot path: queues only, no graph to walk
    else:
        first = _route_keys(exchange.router, routing_keys, headers)
    return _walk(exchanges, exchange, first, routing_keys, headers)


def _route_keys(
    router: Router, routing_keys: Sequence[str], headers: Mapping[str, Any] | None
) -> Collection[Destination]:
    if len(routing_keys) == 1 or not getattr(router, "uses_routing_key", True):
        return router.route(routing_keys[0] if routing_keys else "", headers)
    union: set[Destination] = set()
    for key in dict.fromkeys(routing_keys):
        union.update(router.route(key, headers))
    return union


def _walk(
    exchanges: Mapping[str, Exchange],
    start: Exchange,
    start_destinations: Collection[Destination],
    routing_keys: Sequence[str],
    headers: Mapping[str, Any] | None,
) -> set[str]:
    queues: set[str] = set()
    seen = {start.name}
    pending: list[tuple[Exchange, Collection[Destination]]] = [(start, start_destinations)]
    while pending:
        current, destinations = pending.pop()
        if destinations:
            for kind, name in destinations:
                if kind == QUEUE:
                    queues.add(name)
                elif name not in seen:
                    seen.add(name)
                    _push(exchanges, name, pending, routing_keys, headers)
        else:
            alternate = current.alternate_exchange
            if alternate is not None and alternate not in seen:
                seen.add(alternate)
                _push(exchanges, alternate, pending, routing_keys, headers)
    return queues


def _push(
    exchanges: Mapping[str, Exchange],
    name: str,
    pending: list[tuple[Exchange, Collection[Destination]]],
    routing_keys: Sequence[str],
    headers: Mapping[str, Any] | None,
) -> None:
    exchange = exchanges.get(name)
    if exchange is not None:
        pending.append((exchange, _route_keys(exchange.router, routing_keys, headers)))
