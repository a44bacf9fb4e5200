"""A virtual host: its exchanges, queues and bindings, and the rules for changing them.

Owns: declaring, checking equivalence of, binding and deleting exchanges and queues in one vhost, with
RabbitMQ's errors (codes and texts); routing a published message to queues. It does not check
permissions (the channel does) and does not know about connections except as opaque exclusive owners.

Rules:
- Every vhost has the default exchange "" and amq.direct, amq.fanout, amq.topic, amq.headers, amq.match.
- Names starting with "amq." are reserved for declare (passive declare allowed) and delete.
- Deleting a queue removes its bindings; an auto-delete exchange goes when its last binding as a source
  goes. Deleting or unbinding something missing is not an error.
"""

from __future__ import annotations

from typing import Any

from hutch.amqp.errors import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
    ChannelError,
)
from hutch.core.queue_type import Queue
from hutch.core.routing import (
    LOCAL_RANDOM,
    QUEUE,
    Binding,
    Exchange,
    InvalidBinding,
    InvalidExchange,
    LocalRandomRouter,
    UnknownExchangeType,
    exchange_dest,
    queue_dest,
    route,
    routing_type,
    validate_binding,
    validate_exchange,
)

BUILTIN_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)

# x-arguments whose values must match on redeclare (RabbitMQ's equivalence-checked arguments)
EQUIVALENCE_ARGS = (
    "x-queue-type", "x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-max-priority",
    "x-overflow", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-single-active-consumer",
    "x-delivery-limit", "x-quorum-initial-group-size", "x-queue-leader-locator",
)


def rs(kind: str, name: str, vhost: str) -> str:
    """RabbitMQ's resource string: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def inequivalent(arg: str, kind: str, name: str, vhost: str, received: Any, current: Any) -> ChannelError:
    return ChannelError(
        PRECONDITION_FAILED,
        f"inequivalent arg '{arg}' for {rs(kind, name, vhost)}: "
        f"received '{_fmt(received)}' but current is '{_fmt(current)}'",
    )


def not_found(kind: str, name: str, vhost: str) -> ChannelError:
    return ChannelError(NOT_FOUND, f"no {kind} '{name}' in vhost '{vhost}'")


class VirtualHost:
    def __init__(self, name: str) -> None:
        self.name = name
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        for xname, xtype in BUILTIN_EXCHANGES:
            self.exchanges[xname] = Exchange(vhost=name, name=xname, type=xtype, durable=True)

    # -- exchanges -----------------------------------------------------------------------------
    def lookup_exchange(self, name: str) -> Exchange:
        x = self.exchanges.get(name)
        if x is None:
            raise not_found("exchange", name, self.name)
        return x

    def declare_exchange(self, name: str, type_: str, durable: bool, auto_delete: bool, internal: bool,
                         arguments: dict[str, Any]) -> tuple[Exchange, bool]:
        """Declare (non-passive); returns (exchange, created).

        Like RabbitMQ, an existing exchange (amq.* included) is only checked for equivalence, so
        `exchange.declare("amq.topic", "topic", durable=True)` succeeds; the reserved prefix is
        refused only when the declare would create the exchange."""
        existing = self.exchanges.get(name)
        if existing is not None:
            self._check_exchange_equivalence(existing, type_, durable, auto_delete, internal, arguments)
            return existing, False
        if name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED,
                               f"exchange name '{name}' contains reserved prefix 'amq.*'")
        try:
            validate_exchange(type_, arguments)
        except UnknownExchangeType:
            raise ChannelError(PRECONDITION_FAILED, f"unknown exchange type '{type_}'") from None
        except InvalidExchange as exc:
            raise ChannelError(PRECONDITION_FAILED, str(exc)) from None
        x = Exchange(vhost=self.name, name=name, type=type_, durable=durable, auto_delete=auto_delete,
                     internal=internal, arguments=dict(arguments))
        if isinstance(x.router, LocalRandomRouter):
            x.router.is_local = self._is_local_queue
        self.exchanges[name] = x
        return x, True

    def _is_local_queue(self, name: str) -> bool:
        q = self.queues.get(name)
        return q is not None and not q.remote

    def _check_exchange_equivalence(self, x: Exchange, type_: str, durable: bool, auto_delete: bool,
                                    internal: bool, arguments: dict[str, Any]) -> None:
        for arg, received, current in (
            ("type", type_, x.type),
            ("durable", durable, x.durable),
            ("auto_delete", auto_delete, x.auto_delete),
            ("internal", internal, x.internal),
        ):
            if received != current:
                raise inequivalent(arg, "exchange", x.name, self.name, received, current)
        received_ae = arguments.get("alternate-exchange")
        current_ae = x.arguments.get("alternate-exchange")
        if received_ae != current_ae:
            raise inequivalent("alternate-exchange", "exchange", x.name, self.name,
                               received_ae if received_ae is not None else "none",
                               current_ae if current_ae is not None else "none")

    def delete_exchange(self, name: str, if_unused: bool) -> bool:
        if name == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if name.startswith("amq."):
            raise ChannelError(ACCESS_REFUSED,
                               f"deletion of system {rs('exchange', name, self.name)} not allowed")
        x = self.exchanges.get(name)
        if x is None:
            return False
        if if_unused and len(x.router):
            raise ChannelError(PRECONDITION_FAILED, f"{rs('exchange', name, self.name)} in use")
        self._remove_exchange(x)
        return True

    def _remove_exchange(self, x: Exchange) -> None:
        del self.exchanges[x.name]
        dest = exchange_dest(x.name)
        for other in list(self.exchanges.values()):
            if other.router.remove_destination(dest):
                self._maybe_auto_delete(other)

    def _maybe_auto_delete(self, x: Exchange) -> None:
        if x.auto_delete and not len(x.router) and x.name in self.exchanges:
            self._remove_exchange(x)

    # -- queues --------------------------------------------------------------------------------
    def lookup_queue(self, name: str) -> Queue:
        q = self.queues.get(name)
        if q is None:
            raise not_found("queue", name, self.name)
        return q

    def check_exclusive(self, q: Queue, owner: object) -> None:
        if q.exclusive_owner is not None and q.exclusive_owner is not owner:
            raise self._locked(q)

    def _locked(self, q: Queue) -> ChannelError:
        return ChannelError(
            RESOURCE_LOCKED,
            f"cannot obtain exclusive access to locked {rs('queue', q.name, self.name)}. It could be "
            "originally declared on another connection or the exclusive property value does not "
            "match that of the original declaration.",
        )

    def check_queue_equivalence(self, q: Queue, durable: bool, exclusive: bool, auto_delete: bool,
                                arguments: dict[str, Any], owner: object) -> None:
        self.check_exclusive(q, owner)
        if q.exclusive != exclusive:
            raise self._locked(q)
        for arg, flag, declared in (("durable", durable, q.durable),
                                    ("auto_delete", auto_delete, q.auto_delete)):
            if flag != declared:
                raise inequivalent(arg, "queue", q.name, self.name, flag, declared)
        for arg in EQUIVALENCE_ARGS:
            received = arguments.get(arg)
            current = q.arguments.get(arg)
            if arg == "x-queue-type":
                received = received or "classic"
                current = current or "classic"
            if received != current or type(received) is bool and type(current) is not bool:
                raise inequivalent(arg, "queue", q.name, self.name,
                                   "none" if received is None else received,
                                   "none" if current is None else current)

    def add_queue(self, q: Queue) -> None:
        self.queues[q.name] = q

    def delete_queue(self, q: Queue) -> int:
        """Remove a queue and its bindings; returns the number of ready messages it held."""
        if self.queues.get(q.name) is not q:
            return 0
        del self.queues[q.name]
        dest = queue_dest(q.name)
        for x in list(self.exchanges.values()):
            if x.router.remove_destination(dest):
                self._maybe_auto_delete(x)
        return q.delete()

    # -- bindings ------------------------------------------------------------------------------
    def bind(self, source: Exchange, destination: tuple[str, str], routing_key: str,
             arguments: dict[str, Any]) -> bool:
        if source.name == "":
            raise ChannelError(ACCESS_REFUSED,
                               "operation not permitted on the default exchange")
        kind = routing_type(source.type, source.arguments)
        try:
            validate_binding(kind, arguments, routing_key)
            if kind == LOCAL_RANDOM:
                self._check_local_random_destination(destination)
        except InvalidBinding as exc:
            raise ChannelError(PRECONDITION_FAILED, str(exc)) from None
        return source.router.add(Binding(source.name, destination, routing_key, dict(arguments)))

    def _check_local_random_destination(self, destination: tuple[str, str]) -> None:
        """RabbitMQ 4.x: x-local-random binds only existing classic queues."""
        q = self.queues.get(destination[1]) if destination[0] == QUEUE else None
        if q is None:
            raise InvalidBinding("Destination not found")
        if q.queue_type != "classic":
            raise InvalidBinding(f"Queue type rabbit_{q.queue_type}_queue not valid for this exchange type")

    def unbind(self, source: Exchange, destination: tuple[str, str], routing_key: str,
               arguments: dict[str, Any]) -> bool:
        if source.name == "":
            raise ChannelError(ACCESS_REFUSED,
                               "operation not permitted on the default exchange")
        removed = source.router.remove(destination, routing_key, dict(arguments))
        if removed:
            self._maybe_auto_delete(source)
        return removed

    def bindings(self) -> list[Binding]:
        out: list[Binding] = []
        for x in self.exchanges.values():
            out.extend(x.router.bindings())
        return out

    # -- routing -------------------------------------------------------------------------------
    def route(self, x: Exchange, routing_keys: list[str], headers: dict[str, Any] | None,
              message: Any = None, held: list[Exchange] | None = None) -> list[Queue]:
        """The queues the message reaches; `held` collects delayed exchanges that hold it (core.routing.route)."""
        if x.name == "" and len(routing_keys) == 1:
            q = self.queues.get(routing_keys[0])
            return [q] if q is not None else []
        names = route(self.exchanges, x, routing_keys, headers, message, held)
        queues = self.queues
        return [queues[n] for n in names if n in queues]
