"""Super streams: a partitioned stream as RabbitMQ lays it out, over the broker's exchanges and bindings.

Owns: creating a super stream (a durable direct exchange with `x-super-stream: true`, then each
partition stream, then one binding per partition carrying its routing key and `x-stream-partition-order`,
undone in reverse when a step fails), deleting one (the partitions, then the exchange), and the two
queries the stream protocol answers from the bindings: `partitions` (ordered by partition order) and
`route` (the streams a routing key reaches). Also `partition_index`, what single active consumer needs.

Rules (rabbit_stream_manager): names starting with "amq." are refused; partitions and binding keys come
in equal numbers, without duplicates, at most `MAX_PARTITIONS`; an existing exchange or queue of a
partition's name is refused; the exchange of a super stream is found by its name.
"""

from __future__ import annotations

from typing import Any

from hutch.amqp.errors import AMQPError
from hutch.core.routing.bindings import QUEUE
from hutch.core.vhost import VirtualHost
from hutch.runtime.ports import BrokerPort
from hutch.runtime.stream_session.ports import StreamCatalog, StreamExists, StreamRefused
from hutch.streamproto.codes import Code

MAX_PARTITIONS = 128  # RabbitMQ's default max_super_stream_partitions
PARTITION_ORDER = "x-stream-partition-order"
SUPER_STREAM_ARG = "x-super-stream"


class SuperStreamError(Exception):
    def __init__(self, code: Code, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


def check_name(name: str) -> str:
    """RabbitMQ's `enforce_correct_name`: CR and LF removed, "amq." refused (PRECONDITION_FAILED)."""
    stripped = name.replace("\r", "").replace("\n", "")
    if stripped.startswith("amq.") or not stripped:
        raise SuperStreamError(Code.PRECONDITION_FAILED, f"{name} is not a correct name")
    return stripped


async def create(broker: BrokerPort, catalog: StreamCatalog, vhost: VirtualHost, name: str,
                 partitions: list[str], binding_keys: list[str], arguments: dict[str, str]) -> None:
    name = check_name(name)
    if len(partitions) != len(binding_keys):
        raise SuperStreamError(Code.PRECONDITION_FAILED,
                               "There must be the same number of partitions and binding keys")
    if not partitions or len(set(partitions)) != len(partitions):
        raise SuperStreamError(Code.PRECONDITION_FAILED, f"Duplicate partition names found {partitions}")
    if len(partitions) > MAX_PARTITIONS:
        raise SuperStreamError(Code.PRECONDITION_FAILED,
                               f"The partition number must not exceed {MAX_PARTITIONS}")
    parts = [check_name(p) for p in partitions]
    if name in vhost.exchanges:
        raise SuperStreamError(Code.STREAM_ALREADY_EXISTS, f"there is already an exchange named {name}")
    for p in parts:
        if p in vhost.queues:
            raise SuperStreamError(Code.STREAM_ALREADY_EXISTS, f"there is already a queue named {p}")
    exchange = broker.declare_exchange(vhost, name, "direct", True, False, False, {SUPER_STREAM_ARG: True})
    created: list[str] = []
    try:
        for p in parts:
            await catalog.create(vhost.name, p, arguments)
            created.append(p)
        for order, (p, key) in enumerate(zip(parts, binding_keys, strict=True)):
            broker.bind(vhost, exchange, (QUEUE, p), key, {PARTITION_ORDER: order})
    except (StreamExists, StreamRefused, AMQPError, OSError) as exc:
        for p in reversed(created):
            await catalog.delete(vhost.name, p)
        broker.delete_exchange(vhost, name, False)
        if isinstance(exc, StreamExists):
            raise SuperStreamError(Code.STREAM_ALREADY_EXISTS, str(exc)) from None
        code = exc.code if isinstance(exc, StreamRefused) else Code.PRECONDITION_FAILED
        raise SuperStreamError(code, str(exc)) from None


def _ordered_bindings(vhost: VirtualHost, name: str) -> list[tuple[int, str, str]]:
    """(order, stream, routing key) of the super stream's bindings to streams, by partition order."""
    x = vhost.exchanges.get(name)
    if x is None:
        raise SuperStreamError(Code.STREAM_DOES_NOT_EXIST, f"super stream {name} does not exist")
    out = []
    for b in x.router.bindings():
        kind, dest = b.destination
        if kind != QUEUE:
            continue
        order = _order(b.arguments.get(PARTITION_ORDER), dest)
        out.append((order, dest, b.routing_key))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def _order(value: Any, stream: str) -> int:
    """The binding's partition order, else the number after the stream name's last '-' (RabbitMQ)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    tail = stream.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def partitions(vhost: VirtualHost, name: str) -> list[str]:
    seen: list[str] = []
    for _, stream, _ in _ordered_bindings(vhost, name):
        if stream not in seen:
            seen.append(stream)
    return seen


def route(vhost: VirtualHost, name: str, routing_key: str) -> list[str]:
    """The partitions bound with exactly `routing_key` (a super stream's exchange is a direct one)."""
    streams: list[str] = []
    for _, stream, key in _ordered_bindings(vhost, name):
        if key == routing_key and stream not in streams:
            streams.append(stream)
    return streams


def partition_index(vhost: VirtualHost, super_stream: str, stream: str) -> int:
    """The stream's order among the super stream's partitions (-1: not a partition of it)."""
    try:
        bindings = _ordered_bindings(vhost, super_stream)
    except SuperStreamError:
        return -1
    for order, dest, _ in bindings:
        if dest == stream:
            return order
    return -1


async def delete(broker: BrokerPort, catalog: StreamCatalog, vhost: VirtualHost, name: str) -> None:
    name = check_name(name)
    streams = partitions(vhost, name)
    for stream in streams:
        await catalog.delete(vhost.name, stream)
    broker.delete_exchange(vhost, name, False)
