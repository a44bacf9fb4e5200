"""Super streams: a partitioned stream as RabbitMQ lays it out, over the broker's exchanges and bindings.

Owns: creating a super stream (a durable direct exchange with `x-super-stream: true`, then each
partition stream, then one binding per partition carrying its routing key and `x-stream-partition-order`,
undone in reverse when a step fails), deleting one (the partitions, then the exchange), and the two
queries the stream protocol answers from the bindings: `partitions` (ordered by partition order) and
`route` (the streams a routing key reaches). Also `partition_index`, what single active consumer needs.

Rules (rabbit_stream_manager): names starting with "amq." are refused; partitions and binding keys come
in equal numbers, without duplicates, at most `MAX_PARTITIONS`; an existing exchange or queue of a
partition's name is refused; the exchange of a super stream is found by its name.

The loop (`declare_in_slices`): partitions and then bindings are made one per loop turn, never all
at once (128 at once stalled every client of the node 0.5-2.9 s when each cost its syncs on the loop).
Between two turns other commands run, so the command stays all or nothing by checking again: a
partition declared meanwhile by someone else fails its declare, and an exchange deleted meanwhile (a
`delete_super_stream` of the name while it is being created) is found before the next binding; either
way what this creation made is undone and the command refused. The answer is sent after every
partition and binding exists (a `partitions` query meanwhile may list the partitions bound so far); a
second create of the same name finds the exchange, declared before the first yield, and is refused
with STREAM_ALREADY_EXISTS.

Syncs: a creation's definition records (the exchange, each partition's declare, each binding) are one
group of the definitions log (`BrokerPort.grouped`, runtime/broker/definitions.py "Groups"): appended
as they are made, durable together by the group's end, one fdatasync before the answer (on a clustered
node, the default, a node of workers too: held by the node and proposed as one metadata entry at the
end, committed and applied by the connected members before the answer); a partition's
new files are synced with its first data, not at its declare (storage/stream_log.py). So a creation of
128 partitions costs one sync, where it cost 128 × 6 + 128 (~1.5 s of syncs on an idle disk, 19.7 s
for eight at once). Across a crash it stays all or nothing: before the group's end a restart finds
none of its records (the partitions' directories are orphans, removed at recovery), after it all of
them; a creation given up (undone) never ends its group. A deletion is one group too: a crash midway
leaves the whole super stream (a partition deleted before the crash comes back empty, its files gone),
which the next delete removes.
"""

from __future__ import annotations

import asyncio
import secrets
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
    group = secrets.randbits(63)
    try:
        await _create_grouped(broker, catalog, vhost, name, parts, binding_keys, arguments, group)
    except BaseException:
        await broker.end_group(group, commit=False)  # (undone in memory: nothing of it is durable)
        raise
    await broker.end_group(group)  # the creation's one sync (one metadata entry), before the answer


async def _create_grouped(broker: BrokerPort, catalog: StreamCatalog, vhost: VirtualHost, name: str,
                          parts: list[str], binding_keys: list[str], arguments: dict[str, str], group: int) -> None:
    with broker.grouped(group):  # every record below: durable together by end_group, or never
        exchange = broker.declare_exchange(vhost, name, "direct", True, False, False, {SUPER_STREAM_ARG: True})
        created: list[str] = []
        try:
            await declare_in_slices(catalog, vhost.name, parts, arguments, created)
            for order, (p, key) in enumerate(zip(parts, binding_keys, strict=True)):
                if vhost.exchanges.get(name) is not exchange:
                    raise SuperStreamError(Code.STREAM_DOES_NOT_EXIST,
                                           f"super stream {name} was deleted while it was created")
                broker.bind(vhost, exchange, (QUEUE, p), key, {PARTITION_ORDER: order})
                await asyncio.sleep(0)
        except (StreamExists, StreamRefused, AMQPError, OSError, SuperStreamError) as exc:
            await _undo(catalog, vhost.name, created)  # (in the group, which never ends: nothing is durable)
            if vhost.exchanges.get(name) is exchange:
                broker.delete_exchange(vhost, name, False)
            if isinstance(exc, SuperStreamError):
                raise
            if isinstance(exc, StreamExists):
                raise SuperStreamError(Code.STREAM_ALREADY_EXISTS, str(exc)) from None
            code = exc.code if isinstance(exc, StreamRefused) else Code.PRECONDITION_FAILED
            raise SuperStreamError(code, str(exc)) from None


async def declare_in_slices(catalog: StreamCatalog, vhost: str, parts: list[str], arguments: dict[str, str],
                            created: list[str]) -> None:
    """Declare each of `parts` as a stream, one per loop turn; `created` gets each one declared (what
    to undo if a later one fails)."""
    for p in parts:
        await catalog.create(vhost, p, arguments)
        created.append(p)
        await asyncio.sleep(0)  # the next partition in the next turn (a declare does not always yield)


async def _undo(catalog: StreamCatalog, vhost: str, created: list[str]) -> None:
    """Delete the partitions a failed creation declared, newest first, one per loop turn."""
    for p in reversed(created):
        await catalog.delete(vhost, p)
        await asyncio.sleep(0)


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
    group = secrets.randbits(63)
    try:
        with broker.grouped(group):
            for stream in streams:
                await catalog.delete(vhost.name, stream)
                await asyncio.sleep(0)  # one partition a loop turn, as they were declared
            broker.delete_exchange(vhost, name, False)
    finally:  # (a deletion that failed midway keeps on disk what it deleted in memory)
        await broker.end_group(group)
