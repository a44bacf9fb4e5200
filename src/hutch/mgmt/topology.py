"""Service layer: queues, exchanges and bindings, as the management API and hutchctl see them.

Owns: listing, showing, declaring, deleting and purging queues and exchanges, and listing
bindings, on behalf of an authenticated `Principal`. Functions return JSON-able data (or whether
a PUT created something) and raise `ApiError`. No IO, no awaiting.

Rules (RabbitMQ's HTTP semantics):
- Reading needs the vhost to be visible to the caller (see access.py); changing needs the
  caller's AMQP permissions, as if the caller had opened a channel: configure to declare or
  delete, read to purge, and write on an alternate or dead-letter exchange named in arguments.
- The default exchange is called `amq.default` in URLs and `""` in replies.
- A PUT body's `durable` and `auto_delete` default to false and `arguments` to {}, as the AMQP
  method's fields do; `exclusive` cannot be set over HTTP (there is no connection to own it).
- Declaring something that exists with other properties is a 400 with the AMQP error text;
  an AMQP ACCESS_REFUSED is 401 "Access refused.".
- Lists include every queue's implicit binding to the default exchange, as RabbitMQ's do.
- Bindings made or removed over HTTP need what queue.bind/exchange.bind need over AMQP: write on the
  destination, read on the source. One binding is named by RabbitMQ's `properties_key`: the quoted
  routing key (`~` when empty), plus `~` and a hash of the arguments when there are arguments.
- Binding lists of a named exchange or queue answer 404 when it does not exist (RabbitMQ answers an
  empty list); so does a binding that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, unquote_plus

from hutch.amqp.errors import AMQPError
from hutch.core.routing import DELAYED_MESSAGE, arguments_hash, exchange_dest, queue_dest

from . import formats, listing
from .access import Principal, require_amqp, vhost_for_read, vhost_for_write, visible_vhosts
from .errors import access_refused, bad_request, from_amqp, not_found

if TYPE_CHECKING:
    from hutch.core.queue_type import Queue
    from hutch.core.routing import Exchange
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import DelayedPort, ManagementAgentPort

    from .listing import Query
    from .stats import StatsView

MAX_NAME_BYTES = 255


def _vhosts(node: Node, p: Principal, vhost: str | None) -> Iterable[VirtualHost]:
    """The vhost named (checked readable), or every vhost visible to the caller."""
    if vhost is not None:
        return [vhost_for_read(node, p, vhost)]
    return [node.vhosts[name] for name in visible_vhosts(node, p) if name in node.vhosts]


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if isinstance(value, bool):
        return value
    if value in ("true", "false"):
        return value == "true"
    raise bad_request(f"{key} must be true or false")


def _arguments(body: dict[str, Any]) -> dict[str, Any]:
    value = body.get("arguments")
    if value is None or value == "" or value == []:
        return {}
    if not isinstance(value, dict):
        raise bad_request("arguments must be a JSON object")
    return value


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("not_json")
    return body


def _check_name(kind: str, name: str) -> None:
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise bad_request(f"{kind} name is longer than {MAX_NAME_BYTES} bytes")


def exchange_name(url_name: str) -> str:
    """The exchange a URL names: "amq.default" is the default exchange ""."""
    return "" if url_name == formats.DEFAULT_EXCHANGE_URL_NAME else url_name


# -- queues -----------------------------------------------------------------------------------------


async def queue_list(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str | None, query: Query,
                     stats: StatsView | None = None) -> Any:
    """GET /api/queues[/{vhost}]: the queues of the vhosts the caller can see, asked of the node's agent;
    only the page is fetched in full when a page is asked for (listing.paged_reply_of)."""
    names = [v.name for v in _vhosts(node, p, vhost)]

    async def fetch(lights: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found = await agent.queue_details([(q["vhost"], q["name"]) for q in lights])
        return [formats.queue_rates(q, stats) for q in found]

    return await listing.paged_reply_of(await agent.queues(names), query, fetch)


def exchange_objects(node: Node, p: Principal, vhost: str | None = None) -> list[Exchange]:
    return [x for v in _vhosts(node, p, vhost) for x in v.exchanges.values()]


def exchange_light(x: Exchange) -> dict[str, Any]:
    return {"name": x.name, "vhost": x.vhost, "type": x.type, "durable": x.durable, "auto_delete": x.auto_delete,
            "internal": x.internal}


def _queue(node: Node, p: Principal, vhost: str, name: str) -> Queue:
    q = vhost_for_read(node, p, vhost).queues.get(name)
    if q is None:
        raise not_found()
    return q


async def get_queue(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str, name: str,
                    stats: StatsView | None = None) -> dict[str, Any]:
    _queue(node, p, vhost, name)
    found = await agent.queue_details([(vhost, name)])
    if not found:  # deleted while the agent was asked
        raise not_found()
    out = formats.queue_rates(found[0], stats)
    out["consumer_details"] = await agent.consumers((vhost, name))  # this node's (a consumer elsewhere: not here)
    return out


def put_queue(node: Node, p: Principal, vhost: str, name: str, body: Any) -> bool:
    """Declare a queue; True if it was created, False if an equivalent one existed."""
    v = vhost_for_write(node, p, vhost)
    body = _body(body)
    durable = _bool(body, "durable")
    auto_delete = _bool(body, "auto_delete")
    arguments = _arguments(body)
    _check_name("queue", name)
    if name.startswith("amq."):
        raise access_refused()
    require_amqp(node, p, vhost, "configure", "queue", name)
    dlx = arguments.get("x-dead-letter-exchange")
    if isinstance(dlx, str):
        require_amqp(node, p, vhost, "write", "exchange", dlx)
        require_amqp(node, p, vhost, "read", "queue", name)
    created = name not in v.queues
    try:
        node.declare_queue(v, name, durable, False, auto_delete, arguments, None)
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return created


async def delete_queue(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str, name: str,
                       if_unused: bool = False, if_empty: bool = False) -> None:
    """Delete a queue through the node's agent (the process holding it checks and deletes at once)."""
    if name not in vhost_for_write(node, p, vhost).queues:
        raise not_found()
    require_amqp(node, p, vhost, "configure", "queue", name)
    outcome = await agent.delete_queue(vhost, name, if_unused, if_empty)
    if outcome == "in_use":
        raise bad_request(f"queue '{name}' in vhost '{vhost}' in use")
    if outcome == "not_empty":
        raise bad_request(f"queue '{name}' in vhost '{vhost}' is not empty")
    if outcome == "absent":  # deleted meanwhile
        raise not_found()


async def purge_queue(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str, name: str) -> int:
    """Drop the queue's ready messages, through the node's agent; returns how many."""
    if name not in vhost_for_write(node, p, vhost).queues:
        raise not_found()
    require_amqp(node, p, vhost, "read", "queue", name)
    purged = await agent.purge_queue(vhost, name)
    if purged is None:  # deleted meanwhile
        raise not_found()
    return purged


# -- exchanges --------------------------------------------------------------------------------------


class HeldCounts:
    """The x-delayed-message exchanges' `messages_delayed`: what the management agent gathered (a node of
    workers: what each worker holds itself, summed) plus what the exchange's replica holds, once."""

    def __init__(self, rows: list[list[Any]], delayed: DelayedPort | None) -> None:
        self._held = {(str(r[0]), str(r[1])): int(r[2]) for r in rows}
        self._delayed = delayed

    def count(self, vhost: str, exchange: str) -> int:
        replica = self._delayed.in_replica(vhost, exchange) if self._delayed is not None else 0
        return self._held.get((vhost, exchange), 0) + replica


async def delayed_held(agent: ManagementAgentPort, node: Node, exchanges: Iterable[Exchange]) -> HeldCounts | None:
    """The held counts, asked of the agent only when one of `exchanges` is an x-delayed-message exchange."""
    if not any(x.type == DELAYED_MESSAGE for x in exchanges):
        return None
    return HeldCounts(await agent.delayed_counts(), node.delayed)


def _exchange(node: Node, p: Principal, vhost: str, url_name: str) -> Exchange:
    x = vhost_for_read(node, p, vhost).exchanges.get(exchange_name(url_name))
    if x is None:
        raise not_found()
    return x


async def get_exchange(agent: ManagementAgentPort, node: Node, p: Principal, vhost: str, url_name: str,
                       stats: StatsView | None = None) -> dict[str, Any]:
    x = _exchange(node, p, vhost, url_name)
    return formats.exchange_json(x, stats, await delayed_held(agent, node, (x,)))


def put_exchange(node: Node, p: Principal, vhost: str, url_name: str, body: Any) -> bool:
    """Declare an exchange; True if it was created."""
    v = vhost_for_write(node, p, vhost)
    body = _body(body)
    name = exchange_name(url_name)
    type_ = body.get("type", "direct")
    if not isinstance(type_, str) or not type_:
        raise bad_request("type must be a non-empty string")
    durable = _bool(body, "durable")
    auto_delete = _bool(body, "auto_delete")
    internal = _bool(body, "internal")
    arguments = _arguments(body)
    _check_name("exchange", name)
    if name == "" or name.startswith("amq."):
        raise access_refused()
    require_amqp(node, p, vhost, "configure", "exchange", name)
    alternate = arguments.get("alternate-exchange")
    if alternate is not None:
        if not isinstance(alternate, str):
            raise bad_request(f"invalid arg 'alternate-exchange' for exchange '{name}' in vhost '{vhost}'")
        require_amqp(node, p, vhost, "write", "exchange", alternate)
    created = name not in v.exchanges
    try:
        node.declare_exchange(v, name, type_, durable, auto_delete, internal, arguments)
    except AMQPError as exc:
        raise from_amqp(exc) from None
    return created


def delete_exchange(node: Node, p: Principal, vhost: str, url_name: str, if_unused: bool = False) -> None:
    v = vhost_for_write(node, p, vhost)
    name = exchange_name(url_name)
    if name not in v.exchanges:
        raise not_found()
    if name == "" or name.startswith("amq."):
        raise access_refused()
    require_amqp(node, p, vhost, "configure", "exchange", name)
    try:
        node.delete_exchange(v, name, if_unused)
    except AMQPError as exc:
        raise from_amqp(exc) from None


# -- bindings ---------------------------------------------------------------------------------------


def _bindings(v: VirtualHost) -> list[dict[str, Any]]:
    out = [formats.default_binding_json(v.name, qname) for qname in v.queues]
    out.extend(formats.binding_json(v.name, b) for b in v.bindings())
    return out


def list_bindings(node: Node, p: Principal, vhost: str | None = None) -> list[dict[str, Any]]:
    return [b for v in _vhosts(node, p, vhost) for b in _bindings(v)]


def queue_bindings(node: Node, p: Principal, vhost: str, name: str) -> list[dict[str, Any]]:
    _queue(node, p, vhost, name)
    v = node.vhosts[vhost]
    return [b for b in _bindings(v) if b["destination_type"] == "queue" and b["destination"] == name]


def exchange_bindings(node: Node, p: Principal, vhost: str, url_name: str, side: str) -> list[dict[str, Any]]:
    """GET /api/exchanges/{vhost}/{name}/bindings/source (`side` "source": bindings from the exchange)
    or /destination (bindings to it)."""
    x = _exchange(node, p, vhost, url_name)
    v = node.vhosts[vhost]
    if side == "source":
        return [b for b in _bindings(v) if b["source"] == x.name]
    return [b for b in _bindings(v) if b["destination_type"] == "exchange" and b["destination"] == x.name]


DESTINATION_TYPES = {"q": "queue", "e": "exchange"}


def _binding_ends(node: Node, p: Principal, vhost: str, source_url: str, dtype: str, dest: str,
                  write: bool = False) -> tuple[VirtualHost, Exchange, tuple[str, str]]:
    """The vhost, source exchange and destination a bindings URL names; 404 when one is missing."""
    v = vhost_for_write(node, p, vhost) if write else vhost_for_read(node, p, vhost)
    kind = DESTINATION_TYPES.get(dtype)
    if kind is None:
        raise not_found()
    source = v.exchanges.get(exchange_name(source_url))
    if source is None:
        raise not_found()
    if kind == "queue":
        if dest not in v.queues:
            raise not_found()
        return v, source, queue_dest(dest)
    if exchange_name(dest) not in v.exchanges:
        raise not_found()
    return v, source, exchange_dest(exchange_name(dest))


def bindings_between(node: Node, p: Principal, vhost: str, source_url: str, dtype: str, dest: str
                     ) -> list[dict[str, Any]]:
    """GET /api/bindings/{vhost}/e/{source}/q|e/{destination}."""
    v, source, (kind, name) = _binding_ends(node, p, vhost, source_url, dtype, dest)
    return [b for b in _bindings(v) if b["source"] == source.name and b["destination_type"] == kind
            and b["destination"] == name]


def _require_bind_permissions(node: Node, p: Principal, vhost: str, source: str,
                              destination: tuple[str, str]) -> None:
    kind, name = destination
    require_amqp(node, p, vhost, "write", kind, name)
    require_amqp(node, p, vhost, "read", "exchange", source)


def create_binding(node: Node, p: Principal, vhost: str, source_url: str, dtype: str, dest: str, body: Any
                   ) -> str:
    """POST /api/bindings/{vhost}/e/{source}/q|e/{destination}: bind as queue.bind/exchange.bind would;
    returns the new binding's properties_key (the last segment of its URL)."""
    v, source, destination = _binding_ends(node, p, vhost, source_url, dtype, dest, write=True)
    body = _body(body)
    routing_key = body.get("routing_key", "")
    if routing_key is None:
        routing_key = ""
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    arguments = _arguments(body)
    _require_bind_permissions(node, p, vhost, source.name, destination)
    try:
        if destination[0] == "queue":
            v.check_exclusive(v.queues[destination[1]], None)
        node.bind(v, source, destination, routing_key, arguments)
    except AMQPError as exc:
        raise from_amqp(exc) from None
    for b in source.router.bindings():
        if b.destination == destination and b.routing_key == routing_key and b.arguments == arguments:
            return b.properties_key
    return ""  # pragma: no cover - the binding was just added


def binding_location(destination: str, properties_key: str) -> str:
    """The Location of a new binding, relative to the POST's URL (.../{destination}) as RabbitMQ's
    relativise makes it: the destination's segment, then the properties key, percent-encoded."""
    return quote(destination, safe="") + "/" + quote(properties_key, safe="")


def _find_binding(node: Node, p: Principal, vhost: str, source_url: str, dtype: str, dest: str, props: str,
                  write: bool = False) -> tuple[VirtualHost, Exchange, Any]:
    v, source, destination = _binding_ends(node, p, vhost, source_url, dtype, dest, write)
    if props == "~":
        parts = [""]
    else:
        parts = props.split("~")
    if len(parts) > 2:
        raise bad_request(f"too_many_tokens: {props}")
    routing_key = unquote_plus(parts[0])
    args_hash = unquote(parts[1]) if len(parts) == 2 else None
    for b in source.router.bindings():
        if b.destination != destination or b.routing_key != routing_key:
            continue
        if (args_hash is None and not b.arguments) or (
                args_hash is not None and b.arguments and arguments_hash(b.arguments) == args_hash):
            return v, source, b
    raise not_found()


def get_binding(node: Node, p: Principal, vhost: str, source_url: str, dtype: str, dest: str, props: str
                ) -> dict[str, Any]:
    v, _source, b = _find_binding(node, p, vhost, source_url, dtype, dest, props)
    return formats.binding_json(v.name, b)


def delete_binding(node: Node, p: Principal, vhost: str, source_url: str, dtype: str, dest: str,
                   props: str) -> None:
    v, source, b = _find_binding(node, p, vhost, source_url, dtype, dest, props, write=True)
    _require_bind_permissions(node, p, vhost, source.name, b.destination)
    try:
        node.unbind(v, source, b.destination, b.routing_key, b.arguments)
    except AMQPError as exc:
        raise from_amqp(exc) from None


__all__ = [
    "binding_location",
    "exchange_light",
    "exchange_objects",
    "bindings_between",
    "create_binding",
    "delete_binding",
    "delete_exchange",
    "exchange_bindings",
    "get_binding",
    "delete_queue",
    "exchange_name",
    "delayed_held",
    "get_exchange",
    "get_queue",
    "list_bindings",
    "purge_queue",
    "put_exchange",
    "put_queue",
    "queue_list",
    "queue_bindings",
]
