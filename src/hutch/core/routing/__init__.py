"""Exchange routing: bindings, the exchange types, and the publish-time graph walk.

Owns: the `Binding` and `Exchange` records, one `Router` per exchange type (direct, fanout, topic,
headers, and the plugin types x-consistent-hash, x-random, x-local-random; an x-delayed-message
exchange routes with the router of its `x-delayed-type`) that indexes an exchange's bindings, and `route()`, which turns (exchange, routing keys,
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

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .bindings import (
    DEFAULT_EXCHANGE,
    EXCHANGE,
    EXCHANGE_TYPES,
    NO_DESTINATIONS,
    QUEUE,
    TOPIC_ROUTE_CACHE_ENTRIES,
    X_MATCH_VALUES,
    Binding,
    Destination,
    Destinations,
    DirectRouter,
    FanoutRouter,
    InvalidBinding,
    Router,
    UnknownExchangeType,
    _BindingTable,
    arguments_hash,
    exchange_dest,
    freeze_arguments,
    queue_dest,
)
from .headers import HeadersPattern, HeadersRouter, compile_headers_pattern, validate_headers_binding
from .plugins import (
    CONSISTENT_HASH,
    DELAYED_MESSAGE,
    LOCAL_RANDOM,
    RANDOM,
    ConsistentHashRouter,
    InvalidExchange,
    LocalRandomRouter,
    RandomRouter,
    binding_weight,
    message_delay,
    validate_consistent_hash_exchange,
    validate_local_random_binding,
)
from .topic import TopicRouter, split_topic_key

_ROUTER_TYPES: dict[str, type[_BindingTable]] = {
    "direct": DirectRouter,
    "fanout": FanoutRouter,
    "topic": TopicRouter,
    "headers": HeadersRouter,
    CONSISTENT_HASH: ConsistentHashRouter,
    RANDOM: RandomRouter,
    LOCAL_RANDOM: LocalRandomRouter,
}


def make_router(exchange_type: str) -> Router:
    router_type = _ROUTER_TYPES.get(exchange_type)
    if router_type is None:
        raise UnknownExchangeType(exchange_type)
    return router_type()


def validate_exchange(exchange_type: str, arguments: Mapping[str, Any]) -> None:
    """Exchange-type checks on declare: UnknownExchangeType, or InvalidExchange with RabbitMQ's text."""
    if exchange_type == DELAYED_MESSAGE:
        inner = arguments.get("x-delayed-type")
        if inner == DELAYED_MESSAGE:
            raise InvalidExchange("Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'")
        if not isinstance(inner, str) or inner not in _ROUTER_TYPES:
            raise InvalidExchange("Invalid argument, 'x-delayed-type' must be an existing exchange type")
        exchange_type = inner
    if exchange_type not in _ROUTER_TYPES:
        raise UnknownExchangeType(exchange_type)
    if exchange_type == CONSISTENT_HASH:
        validate_consistent_hash_exchange(arguments)


def routing_type(exchange_type: str, arguments: Mapping[str, Any]) -> str:
    """The type whose rules route the exchange's messages (an x-delayed-message exchange's inner type)."""
    if exchange_type == DELAYED_MESSAGE:
        inner = arguments.get("x-delayed-type")
        return inner if isinstance(inner, str) else "direct"
    return exchange_type


def validate_binding(exchange_type: str, arguments: Mapping[str, Any] | None, routing_key: str = "") -> None:
    """Exchange-type checks on a binding's key and arguments; raises InvalidBinding (RabbitMQ's texts).

    `exchange_type` is the routing type (`routing_type`). Local-random's queue checks need the queues
    and are the virtual host's."""
    if exchange_type == "headers":
        validate_headers_binding(arguments)
    elif exchange_type == CONSISTENT_HASH:
        binding_weight(routing_key)
    elif exchange_type == LOCAL_RANDOM:
        validate_local_random_binding(routing_key)


@dataclass(eq=False, slots=True)
class Exchange:
    """An exchange and its bindings (in `router`, built from `type`).

    `alternate_exchange` starts from arguments["alternate-exchange"]; a policy may set it when that
    argument is absent (runtime/broker/policies.py), and `policy` names the policy that applies, if any.
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
    policy: str | None = field(init=False)

    def __post_init__(self) -> None:
        self.router = make_router(routing_type(self.type, self.arguments))
        if isinstance(self.router, ConsistentHashRouter):
            self.router.configure(self.arguments)
        self.policy = None
        alternate = self.arguments.get("alternate-exchange")
        self.alternate_exchange = alternate if isinstance(alternate, str) else None


def route(
    exchanges: Mapping[str, Exchange],
    exchange: Exchange,
    routing_keys: Sequence[str],
    headers: Mapping[str, Any] | None,
    message: Any = None,
    held: list[Exchange] | None = None,
) -> set[str]:
    """Return the set of QUEUE names the message reaches.

    Follows exchange-to-exchange bindings (each exchange visited once, so cycles terminate); for every
    exchange that routes the message nowhere, tries its alternate_exchange if it exists in `exchanges`
    (also cycle-safe). `routing_keys` has more than one element when the publisher used CC/BCC headers:
    the message is routed with each key and the union taken. Queue names are returned even if the queue
    does not exist; the caller filters. `message` (the published `Message`) is read only by a
    consistent-hash exchange with `hash-property`, so its properties are decoded only then.
    With `held` given, an x-delayed-message exchange reached through a binding or as an alternate, when
    the message asks for a delay, is appended to it instead of routing: the caller holds the message there
    (the plugin's route/3 does the same). The exchange published to is the caller's to check first.
    """
    if not exchange.name:  # the default exchange: implicit bindings to every queue
        return set(routing_keys)
    if len(routing_keys) == 1:
        first = exchange.router.route(routing_keys[0], headers, message)
        if type(first) is Destinations and first.queues and not first.exchanges:
            return set(first.queues)  # hot path: queues only, no graph to walk
    else:
        first = _route_keys(exchange.router, routing_keys, headers, message)
    return _walk(exchanges, exchange, first, routing_keys, headers, message, held)


def _route_keys(
    router: Router, routing_keys: Sequence[str], headers: Mapping[str, Any] | None, message: Any
) -> Collection[Destination]:
    if len(routing_keys) == 1 or not getattr(router, "uses_routing_key", True):
        return router.route(routing_keys[0] if routing_keys else "", headers, message)
    union: set[Destination] = set()
    for key in dict.fromkeys(routing_keys):
        union.update(router.route(key, headers, message))
    return union


def _walk(
    exchanges: Mapping[str, Exchange],
    start: Exchange,
    start_destinations: Collection[Destination],
    routing_keys: Sequence[str],
    headers: Mapping[str, Any] | None,
    message: Any,
    held: list[Exchange] | None,
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
                    _push(exchanges, name, pending, routing_keys, headers, message, held)
        else:
            alternate = current.alternate_exchange
            if alternate is not None and alternate not in seen:
                seen.add(alternate)
                _push(exchanges, alternate, pending, routing_keys, headers, message, held)
    return queues


def _push(
    exchanges: Mapping[str, Exchange],
    name: str,
    pending: list[tuple[Exchange, Collection[Destination]]],
    routing_keys: Sequence[str],
    headers: Mapping[str, Any] | None,
    message: Any,
    held: list[Exchange] | None,
) -> None:
    exchange = exchanges.get(name)
    if exchange is None:
        return
    if held is not None and exchange.type == DELAYED_MESSAGE and message_delay(headers) is not None:
        held.append(exchange)  # counts as a destination of the exchange that reached it
        return
    pending.append((exchange, _route_keys(exchange.router, routing_keys, headers, message)))

__all__ = [
    "Binding",
    "CONSISTENT_HASH",
    "ConsistentHashRouter",
    "DELAYED_MESSAGE",
    "InvalidExchange",
    "LOCAL_RANDOM",
    "LocalRandomRouter",
    "RANDOM",
    "RandomRouter",
    "message_delay",
    "routing_type",
    "validate_exchange",
    "DEFAULT_EXCHANGE",
    "Destination",
    "Destinations",
    "DirectRouter",
    "EXCHANGE",
    "EXCHANGE_TYPES",
    "Exchange",
    "FanoutRouter",
    "HeadersPattern",
    "HeadersRouter",
    "InvalidBinding",
    "NO_DESTINATIONS",
    "QUEUE",
    "Router",
    "TOPIC_ROUTE_CACHE_ENTRIES",
    "TopicRouter",
    "UnknownExchangeType",
    "X_MATCH_VALUES",
    "arguments_hash",
    "compile_headers_pattern",
    "exchange_dest",
    "freeze_arguments",
    "make_router",
    "queue_dest",
    "route",
    "split_topic_key",
    "validate_binding",
    "validate_headers_binding",
]
