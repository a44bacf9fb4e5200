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
from .topic import TopicRouter, split_topic_key

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
        self.router = make_router(self.type)
        self.policy = None
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

__all__ = [
    "Binding",
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
