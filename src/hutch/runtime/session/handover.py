"""Connection locality, the session's half: when an open AMQP connection may move to another worker of its
node, and what of it moves (docs/scaling.md, "Connection locality").

Owns: `first_publish_queues` (the queues a connection's first publish is judged by), `quiet_reason`
(why a connection may not be handed over now, or None), `HandoverState` (what a
connection carries to the worker that adopts it: its negotiated state, its channels' numbering, and the
bytes read from the socket and not handled yet) and its one codec (`encode`/`decode`, msgpack, a client's
properties as the AMQP field table they came as), and `channel_states` (a connection's channels as
they move; the connection itself captures the rest, `AMQPConnection._hand_over`, and restores it,
`adopt`), and the pieces compaction of load shares (runtime/session/island.py): `blocked_reason`,
`owns_exclusive`, `pack_state` / `unpack_record` / `decode_state_table`. The transfer itself (the socket's descriptor, the supervisor) is runtime/workers/handover.py's;
the trigger and the adoption are the connection's (connection.py).

Rules:
- A connection moves only at a quiet point: nothing it holds may be in flight in this worker. No
  consumers, no unacked deliveries, no unconfirmed publishes, no transaction, no unfinished content, no
  read hold but the per-turn budget, no exclusive queue of its own, no channel closing, no flow or alarm
  block, nothing left to write. A TLS connection moves too, relayed: its TLS session stays in the
  worker that accepted it (the TLS library's state cannot be exported), which pumps the plaintext to
  the new worker over a socket pair (runtime/workers/relay.py).
- What moves is what a client can observe: the user, vhost, frame_max, channel_max, heartbeat, client
  properties, peer and name, the address the client reached, the byte counters and `connected_at`, and
  a TLS connection's identity (its TLS version and cipher, the client certificate); per channel its
  number, prefetch (per consumer and global), confirm mode, publish sequence number (the next confirm's delivery tag
  continues) and next delivery tag.
- A state is bounded (`MAX_STATE_BYTES`, runtime/workers/control.py; a connection with more unread
  bytes than `MAX_UNREAD_BYTES` stays) and checked field by field when decoded: a malformed one is a
  `ValueError`, never a half-adopted connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from hutch.amqp.errors import FrameError
from hutch.amqp.table import decode_table, encode_table
from hutch.runtime.workers.control import MAX_STATE_BYTES


class MovableConnection(Protocol):
    """What the judge reads of a connection (session/connection.py's AMQPConnection)."""

    flow_blocked: bool
    alarm_blocked: bool
    node: Any
    closing_channels: set[int]
    unfinished_body_bytes: int
    channels: dict[int, Any]  # number -> ServerChannel
    vhost_obj: Any

    def state_is_busy(self) -> bool: ...

VERSION = 2  # 2: a TLS connection's identity (relayed: runtime/workers/relay.py) and the address it reached


@dataclass
class ChannelState:
    number: int
    prefetch_count: int = 0
    global_prefetch: int = 0
    confirm: bool = False
    publish_seq: int = 0
    next_tag: int = 1

    def to_wire(self) -> list[Any]:
        return [self.number, self.prefetch_count, self.global_prefetch, self.confirm, self.publish_seq,
                self.next_tag]

    @classmethod
    def from_wire(cls, v: Any) -> ChannelState:
        if not isinstance(v, list) or len(v) != 6:
            raise ValueError("a channel's state is a list of 6")
        number, prefetch, global_prefetch, confirm, seq, next_tag = v
        for name, value, top in (("number", number, 65535), ("prefetch_count", prefetch, 65535),
                                 ("global_prefetch", global_prefetch, 65535), ("publish_seq", seq, 2**63),
                                 ("next_tag", next_tag, 2**63)):
            if type(value) is not int or not 0 <= value <= top:
                raise ValueError(f"channel {name} out of range: {value!r}")
        if number == 0 or next_tag < 1 or type(confirm) is not bool:
            raise ValueError("malformed channel state")
        return cls(number, prefetch, global_prefetch, confirm, seq, next_tag)


@dataclass
class HandoverState:
    user: str
    vhost: str
    frame_max: int
    channel_max: int
    heartbeat_s: int
    client_properties: dict[str, Any]
    auth_mechanism: str
    peer: tuple[str, int]
    name: str
    connected_at_ms: int
    recv_oct: int
    send_oct: int
    has_published: bool
    channels: list[ChannelState] = field(default_factory=list)
    unread: bytes = b""  # the frames read and not handled, the triggering one first
    sockname: tuple[str, int] = ("", 0)  # the node's address the client reached (management's host, port)
    tls: tuple[str, str] | None = None  # (TLS version, cipher) of a relayed TLS connection
    peer_cert: bytes | None = None  # DER of the client certificate its TLS handshake verified

    def encode(self) -> bytes:
        return pack_state([VERSION, self.user, self.vhost, self.frame_max, self.channel_max, self.heartbeat_s,
                           encode_table(self.client_properties), self.auth_mechanism, list(self.peer), self.name,
                           self.connected_at_ms, self.recv_oct, self.send_oct, self.has_published,
                           [c.to_wire() for c in self.channels], self.unread, list(self.sockname),
                           None if self.tls is None else list(self.tls), self.peer_cert])

    @classmethod
    def decode(cls, data: bytes) -> HandoverState:
        """The state `encode` made; ValueError if it is not one (or too large)."""
        v = unpack_record(data, "handover", 19, VERSION)
        (_, user, vhost, frame_max, channel_max, heartbeat_s, props, mechanism, peer, name, connected_at,
         recv_oct, send_oct, has_published, channels, unread, sockname, tls, peer_cert) = v
        if not all(isinstance(s, str) for s in (user, vhost, mechanism, name)):
            raise ValueError("malformed handover state: names")
        if not all(type(n) is int and n >= 0 for n in (frame_max, channel_max, heartbeat_s, connected_at,
                                                        recv_oct, send_oct)):
            raise ValueError("malformed handover state: numbers")
        if not isinstance(props, bytes) or not isinstance(unread, bytes) or type(has_published) is not bool:
            raise ValueError("malformed handover state: fields")
        check_identity("handover state", [peer, sockname], tls, peer_cert)
        if not isinstance(channels, list) or len(channels) > 65535:
            raise ValueError("malformed handover state: channels")
        properties = decode_state_table(props, "handover state: client properties")
        states = [ChannelState.from_wire(c) for c in channels]
        if len({c.number for c in states}) != len(states):
            raise ValueError("malformed handover state: a channel twice")
        return cls(user, vhost, frame_max, channel_max, heartbeat_s, properties, mechanism, (peer[0], peer[1]),
                   name, connected_at, recv_oct, send_oct, has_published, states, unread, (sockname[0], sockname[1]),
                   None if tls is None else (tls[0], tls[1]), peer_cert)


def pack_state(values: list[Any]) -> bytes:
    """A handed over state's values as msgpack (bytes as bytes)."""
    data = msgpack.packb(values, use_bin_type=True)
    assert isinstance(data, bytes)
    return data


def unpack_record(data: bytes, what: str, fields: int, version: int) -> list[Any]:
    """A `what` state of `fields` values whose first is `version` (`unpack_state`); ValueError if not."""
    v = unpack_state(data, what)
    if not isinstance(v, list) or len(v) != fields or v[0] != version:
        raise ValueError(f"not a {what} state of this version")
    return v


def decode_state_table(raw: bytes, what: str) -> dict[str, Any]:
    """An AMQP field table a state carries (`raw`, exactly one table); ValueError naming `what` if not."""
    try:
        table, end = decode_table(raw, 0)
    except FrameError as exc:
        raise ValueError(f"malformed {what}: {exc}") from None
    if end != len(raw):
        raise ValueError(f"malformed {what}")
    return table


def unpack_state(data: bytes, what: str) -> Any:  # Any: a msgpack value, checked by the caller
    """A handed over `what`'s state as msgpack values; ValueError if it is too large or not msgpack."""
    if len(data) > MAX_STATE_BYTES:
        raise ValueError(f"a handed over {what}'s state of {len(data)} bytes is over {MAX_STATE_BYTES}")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed handover state: {exc}") from None


def check_identity(what: str, addresses: list[Any], tls: Any, peer_cert: Any) -> None:  # Any: msgpack values
    """ValueError unless every address is [host, port], `tls` is None or [version, cipher], and
    `peer_cert` is None or the DER bytes of a TLS connection's client certificate."""
    for pair in addresses:
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) and type(pair[1]) is int):
            raise ValueError(f"malformed {what}: an address")
    if tls is not None and not (isinstance(tls, list) and len(tls) == 2 and all(isinstance(t, str) for t in tls)):
        raise ValueError(f"malformed {what}: TLS")
    if peer_cert is not None and (tls is None or not isinstance(peer_cert, bytes)):
        raise ValueError(f"malformed {what}: client certificate")


# exchange types whose queues the exchange and the routing key decide (no headers, no per-message choice)
ROUTED_BY_KEY = frozenset({"direct", "topic", "fanout"})


def first_publish_queues(vhost: Any, exchange: str, routing_key: str) -> list[Any]:  # Any: core's VirtualHost, Queue
    """The queues a connection's first basic.publish reaches by its exchange and routing key alone: the
    default exchange's queue, or what a direct, topic or fanout exchange routes it to (through exchange
    bindings and an alternate exchange too). A headers exchange (the headers are not read yet), one that
    chooses per message (consistent-hash, random) or an unknown one: none, the connection is not moved.
    Called once per connection (O(the exchange's route)), never on the publish path."""
    if not exchange:
        queue = vhost.queues.get(routing_key)
        return [queue] if queue is not None else []
    x = vhost.exchanges.get(exchange)
    if x is None or x.type not in ROUTED_BY_KEY:
        return []
    return list(vhost.route(x, [routing_key], None))


def quiet_reason(conn: MovableConnection) -> str | None:
    """Why `conn` may not move to another worker now, or None: it is quiet (the module's rules). Called
    once per connection, at its first publish or consume: O(its channels + its vhost's queues)."""
    if conn.state_is_busy():
        return "busy"
    reason = blocked_reason(conn)
    if reason is not None:
        return reason
    for ch in conn.channels.values():
        if ch.consumers or ch.reply_consumer is not None or ch.reply_token is not None:
            return "consumers"
        if ch.unacked:
            return "unacked deliveries"
        if ch.tx or ch.tx_ops:
            return "a transaction"
        if ch.confirms is not None and ch.confirms.unanswered:
            return "unconfirmed publishes"
        if ch.content_in_progress():
            return "unfinished content"
    return "exclusive queues" if owns_exclusive(conn) else None


def blocked_reason(conn: MovableConnection) -> str | None:
    """What keeps `conn` from moving whatever it uses: a flow or alarm block (or any alarm on the node:
    connection.blocked's state would have to travel), a channel closing, unfinished content."""
    if conn.flow_blocked or conn.alarm_blocked or conn.node.alarms:
        return "flow or alarm"
    if conn.closing_channels:
        return "a channel closing"
    if conn.unfinished_body_bytes:
        return "unfinished content"
    return None


def owns_exclusive(conn: MovableConnection) -> bool:
    """`conn` owns an exclusive queue (it lives in the connection's worker, so the connection stays)."""
    vhost = conn.vhost_obj
    return vhost is not None and any(q.exclusive_owner is conn for q in vhost.queues.values())



def channel_states(channels: dict[int, Any]) -> list[ChannelState]:
    """What moves of a quiet connection's channels (number -> ServerChannel), in channel order."""
    return [ChannelState(n, ch.prefetch_count, ch.global_prefetch, ch.confirm, ch.publish_seq, ch.next_tag)
            for n, ch in sorted(channels.items())]
