"""Dead-lettering: the message a queue republishes to its dead-letter exchange, and cycle detection.

Owns: `dead_letter` (build the dead-lettered copy of a message and the routing keys to route it with),
`is_cycle` (whether delivering that copy to a queue would close an automatic dead-letter cycle, which
RabbitMQ drops) and `death_queue_names` (the queues of a message's death history, for the warning
RabbitMQ logs about a cycle). Pure: no IO, no clocks; the time of death comes in as `now_s`.

Follows rabbitmq-server 4.x: deps/rabbit/src/rabbit_dead_letter.erl (`publish/5`, `detect_cycles/3`),
mc.erl (`record_death/3`, `update_death/2`, `is_cycle_v2/2`) and mc_amqpl.erl (`protocol_state/2`,
`deaths_to_headers/2`, `death_table/7`). Rules:

- Routing keys: `[dlrk]` when the queue has a dead-letter routing key (even ""), else the routing key the
  message was published with plus its CC header values (BCC was removed at publish).
- x-death is an array of tables, most recent death first, one per (queue, reason). A repeated death
  increments `count` (long, 'l') and moves the entry to the front; everything else in the entry (time,
  exchange, routing-keys, original-expiration) keeps the values of the first such death (mc:update_death
  only bumps count and last_time). A new entry is {original-expiration, count, reason, queue, time (the
  death time, 'T' seconds), exchange (the exchange the message was last published to), routing-keys
  (array of longstr: routing key + CC)}, in mc_amqpl:death_table's field order.
- The expiration property is always removed from the copy (rabbit_dead_letter sets ttl to undefined);
  when there was one, its integer value is recorded as `original-expiration`.
- x-first-death-{reason,queue,exchange} are set on the first death and never changed after;
  x-last-death-{reason,queue,exchange} are set on every death (RabbitMQ 3.13+; 3.10-3.12 set only
  x-first-death-*). Both overwrite client-supplied headers of the same name on the death that sets them.
- Every other property, header and the body are kept byte for byte: the headers table is edited on the
  wire (entries removed with `remove_table_key`, new ones appended), so a client's 'l'/'b'/'s'/'f' values
  do not come back re-typed. The CC header is kept even when a dead-letter routing key replaces the
  routing keys (RabbitMQ 3.13+; 3.12 removed it).

Where hutch differs from RabbitMQ 4.x, and why:
- RabbitMQ 4.x keeps the death history in message-container annotations, so it never reads an x-death
  header a client published (4.0.1 release notes, "AMQP 0.9.1 x-death header"). hutch does the same with
  `history=False`: the channel marks a message a client published with an x-death header
  (`Message.foreign_deaths`), and its first dead-lettering starts a fresh history (the client's header is
  replaced). Later deaths of the dead-lettered copy merge into the broker's own x-death, which travels
  in the message's properties (that is what the message store persists). The mark lives in RAM: a message
  paged out or recovered after a restart counts its client x-death as history (RabbitMQ 3.12's
  behaviour). A malformed x-death is ignored and replaced (3.12's "Resetting header" branch,
  rabbitmq-server#767); array items that are not tables with string `queue` and `reason` are dropped; of
  two items with the same (queue, reason) the first (most recent) is kept.
- Consequently the routing keys recorded by a *second* death are the copy's routing key plus its CC
  header, where RabbitMQ 4.x records the keys of the previous dead-lettering (its routing-keys
  annotation); they differ only when a dead-letter routing key was used on a message with CC.
- RabbitMQ re-sorts the whole headers table by key when it writes the death headers
  (rabbit_misc:set_table_value, the usort in protocol_state); hutch appends the death headers after the
  client's, in their original order. Field-table order carries no meaning in AMQP 0-9-1.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from hutch.amqp.spec import PROPERTY_FIELDS
from hutch.amqp.table import Timestamp, TypedInt, encode_table, remove_table_key
from hutch.core.message import Message

REASONS = ("rejected", "expired", "maxlen", "delivery_limit")

_FIRST_DEATH_KEYS = ("x-first-death-reason", "x-first-death-queue", "x-first-death-exchange")
_LAST_DEATH_KEYS = ("x-last-death-reason", "x-last-death-queue", "x-last-death-exchange")
_U32 = struct.Struct(">I")
_MAX_COUNT = 2**63 - 1  # count is a signed 64-bit 'l'; a client's huge count must not break encoding


@dataclass(frozen=True, slots=True)
class Death:
    """One x-death entry: the deaths of a message in one queue for one reason.

    Invariant: `count` >= 1; `time_s` is the time of the first of those deaths.
    """

    queue: str
    reason: str
    count: int
    time_s: int
    exchange: str
    routing_keys: tuple[str, ...]
    original_expiration: str | None = None

    def to_table(self) -> dict[str, Any]:
        """The x-death table, typed as RabbitMQ writes it (mc_amqpl:death_table/7)."""
        table: dict[str, Any] = {}
        if self.original_expiration is not None:
            table["original-expiration"] = self.original_expiration
        table["count"] = TypedInt(self.count, "l")
        table["reason"] = self.reason
        table["queue"] = self.queue
        table["time"] = Timestamp(self.time_s)
        table["exchange"] = self.exchange
        table["routing-keys"] = list(self.routing_keys)
        return table


def dead_letter(msg: Message, *, queue: str, reason: str, now_s: int, dlx: str,
                dlrk: str | None, history: bool = True) -> tuple[Message, list[str]]:
    """The message to publish to `dlx` and the routing keys to route it with.

    `queue` is the name of the queue the message dies in, `reason` one of REASONS, `now_s` the time of
    death in seconds since the epoch, `dlrk` the queue's dead-letter routing key (None when unset).
    Raises ValueError for an unknown reason. `history=False`: the x-death the message carries was set by
    a client, not by this broker (RabbitMQ 4.x ignores those): the new history starts from this death.
    """
    if reason not in REASONS:
        raise ValueError(f"unknown dead-letter reason {reason!r}")
    props = msg.properties
    headers = props.headers or {}
    original_keys = _routing_keys(msg.routing_key, headers)
    routing_keys = [dlrk] if dlrk is not None else original_keys

    prior = read_deaths(headers, now_s) if history else []
    match = next((d for d in prior if d.queue == queue and d.reason == reason), None)
    if match is not None:
        death = replace(match, count=min(match.count + 1, _MAX_COUNT))
    else:
        death = Death(queue, reason, 1, now_s, msg.exchange, tuple(original_keys),
                      _original_expiration(props.expiration))
    deaths = [death] + [d for d in prior if d is not match]

    added: dict[str, Any] = {"x-death": [d.to_table() for d in deaths]}
    removed = ["x-death", *_LAST_DEATH_KEYS]
    if not prior:
        added.update(zip(_FIRST_DEATH_KEYS, (reason, queue, msg.exchange), strict=True))
        removed += _FIRST_DEATH_KEYS
    added.update(zip(_LAST_DEATH_KEYS, (reason, queue, msg.exchange), strict=True))

    properties_raw = _rewrite_properties(msg.properties_raw, removed, added)
    return Message(dlx, routing_keys[0], None, msg.body, properties_raw), routing_keys


def is_cycle(msg: Message, target_queue: str) -> bool:
    """True when routing this dead-lettered message to `target_queue` would be a cycle RabbitMQ drops:
    the queue already appears in the message's x-death and no death in the cycle was 'rejected'.

    `msg` is the message `dead_letter` returned: its newest death is the one just recorded, so a death
    by rejection is never a cycle (rabbit_dead_letter:detect_cycles/3 short-cuts reason `rejected`).
    The cycle is the deaths up to and including the newest one in `target_queue` (mc:is_cycle_v2/2); an
    item that is not a table counts as a client's doing and breaks the cycle (3.12's is_cycle/2).
    """
    deaths = (msg.properties.headers or {}).get("x-death")
    if not isinstance(deaths, list):
        return False
    for i, item in enumerate(deaths):
        if isinstance(item, dict) and item.get("queue") == target_queue:
            return all(isinstance(d, dict) and d.get("reason") != "rejected" for d in deaths[: i + 1])
    return False


def death_queue_names(msg: Message) -> list[str]:
    """The queues of the message's x-death, most recent first (mc:death_queue_names/1), for logging."""
    deaths = (msg.properties.headers or {}).get("x-death")
    if not isinstance(deaths, list):
        return []
    return [d["queue"] for d in deaths if isinstance(d, dict) and isinstance(d.get("queue"), str)]


def read_deaths(headers: dict[str, Any], now_s: int) -> list[Death]:
    """The death history in a decoded headers table, most recent first; [] when x-death is absent or
    not an array. Items without a string queue and reason are dropped, and later duplicates of a
    (queue, reason); missing or mistyped fields get defaults (count 1, time `now_s`, exchange "")."""
    value = headers.get("x-death")
    if not isinstance(value, list):
        return []
    deaths: list[Death] = []
    seen: set[tuple[str, str]] = set()
    for item in value:
        if not isinstance(item, dict):
            continue
        queue, reason = item.get("queue"), item.get("reason")
        if not isinstance(queue, str) or not isinstance(reason, str) or (queue, reason) in seen:
            continue
        seen.add((queue, reason))
        count = item.get("count")
        time_s = item.get("time")
        exchange = item.get("exchange")
        keys = item.get("routing-keys")
        expiration = item.get("original-expiration")
        deaths.append(Death(
            queue, reason,
            count if _is_int(count) and count >= 1 else 1,
            time_s if _is_int(time_s) and time_s >= 0 else now_s,
            exchange if isinstance(exchange, str) else "",
            tuple(k for k in keys if isinstance(k, str)) if isinstance(keys, list) else (),
            expiration if isinstance(expiration, str) else None,
        ))
    return deaths


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _routing_keys(routing_key: str, headers: dict[str, Any]) -> list[str]:
    """The routing key plus CC values, as the channel routed the publish (rabbit_basic:header_routes)."""
    cc = headers.get("CC")
    if not isinstance(cc, list):
        return [routing_key]
    return [routing_key, *(k for k in cc if isinstance(k, str))]


def _original_expiration(expiration: str | None) -> str | None:
    """RabbitMQ records the parsed per-message TTL (integer_to_binary), so "007" is recorded as "7"."""
    if expiration is None:
        return None
    if expiration.isascii() and expiration.isdigit():
        return str(int(expiration))
    return expiration  # the channel refuses such a publish; keep what the message carried


def _rewrite_properties(raw: bytes, removed: list[str], added: dict[str, Any]) -> bytes:
    """`raw` (flags + property list) without expiration, with `removed` keys taken out of the headers
    table and `added` entries appended to it; every other byte is kept."""
    fields = _split_properties(raw)
    fields.pop("expiration", None)
    table = fields.get("headers")
    if table is None:
        fields["headers"] = encode_table(added)
    else:
        for key in removed:
            table = remove_table_key(table, 0, key)
        body = table[4:] + encode_table(added)[4:]
        fields["headers"] = _U32.pack(len(body)) + body
    flags = 0
    for i, (name, _kind) in enumerate(PROPERTY_FIELDS):
        if name in fields:
            flags |= 1 << (15 - i)
    return flags.to_bytes(2, "big") + b"".join(fields[name] for name, _ in PROPERTY_FIELDS if name in fields)


def _split_properties(raw: bytes) -> dict[str, bytes]:
    """The encoded value of each present property, by name. `raw` is a valid encoded property list
    (it was decoded when the message was published)."""
    flags = raw[0] << 8 | raw[1]
    offset = 2
    fields: dict[str, bytes] = {}
    for i, (name, kind) in enumerate(PROPERTY_FIELDS):
        if not flags & 1 << (15 - i):
            continue
        if kind == "shortstr":
            end = offset + 1 + raw[offset]
        elif kind == "table":
            end = offset + 4 + _U32.unpack_from(raw, offset)[0]
        elif kind == "octet":
            end = offset + 1
        else:  # timestamp
            end = offset + 8
        fields[name] = raw[offset:end]
        offset = end
    return fields
