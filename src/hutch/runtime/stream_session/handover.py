"""Stream connection locality, the session's half: when an open stream-protocol connection may move to its
stream's home worker, and what of it moves (docs/scaling.md, "Connection locality", stream connections).

Owns: `quiet_reason` (why a stream connection may not be handed over now, or None), and
`StreamHandoverState` (what a stream connection carries to the worker that adopts it) with its one codec
(`encode`/`decode`, msgpack; `is_stream_state` tells it from an AMQP connection's state, which travels
the same way). The transfer (the socket's descriptor through the supervisor) is
runtime/workers/handover.py's, as for AMQP; the trigger and the adoption are the connection's
(connection.py, `_hand_over` and `adopt`).

Rules:
- A stream connection is judged once, at its first declare publisher or subscribe: it moves when that
  stream's one copy on the node is another worker's (its home) and the connection is quiet. Quiet: open,
  no publisher, no subscription, no request or login waiting, no read hold (output, confirms,
  closing), nothing left to write. A connection judged (moved or not) is never judged again, so a
  connection that then uses streams of several workers keeps the link path for the others.
- What moves is what the client observes of the connection: the user, vhost, frame_max, heartbeat,
  client properties, auth mechanism, peer, name, `connected_at`, the Deliver version it negotiated,
  the server's correlation counter, the host and port it was told in open and metadata (so it keeps
  following the same address), the address it reached, a TLS connection's identity (TLS version,
  cipher, client certificate), and the unread bytes: the triggering frame, then every byte read and
  not handled yet. Nothing else is in flight at a quiet point.
- A TLS connection moves relayed: its TLS session stays in the worker that accepted it, which pumps
  the plaintext to the home over a socket pair (runtime/workers/relay.py), as for AMQP.
- A state is bounded (`MAX_STATE_BYTES`; a connection with more than `MAX_UNREAD_BYTES` unread stays)
  and checked field by field when decoded: a malformed one is a `ValueError`, never a half-adopted
  connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from hutch.runtime.session.handover import check_identity, unpack_state

MARK = "stream"  # the first field: an AMQP connection's state starts with its version number instead
VERSION = 2  # 2: a TLS connection's identity (relayed: runtime/workers/relay.py) and the address it reached
_MARK_BYTES: bytes = msgpack.packb(MARK)
MAX_UNREAD_BYTES = 1 << 20


class MovableStreamConnection(Protocol):
    """What the judge reads of a stream connection (connection.py's StreamConnection)."""

    out: list[Any]

    def is_open(self) -> bool: ...

    def held(self) -> bool: ...

    def in_use(self) -> bool: ...


def quiet_reason(conn: MovableStreamConnection) -> str | None:
    """Why `conn` may not move to another worker now, or None (the module's rules). O(1)."""
    if not conn.is_open():
        return "not open"
    if conn.held():
        return "reading held"
    if conn.in_use():
        return "publishers or subscriptions"
    if conn.out:
        return "output not written yet"
    return None


@dataclass
class StreamHandoverState:
    user: str
    vhost: str
    frame_max: int
    heartbeat_s: int
    client_properties: dict[str, str]
    auth_mechanism: str
    peer: tuple[str, int]
    name: str
    connected_at_ms: int
    deliver_version: int
    correlation: int
    advertised: tuple[str, int]
    unread: bytes = b""  # the frames read and not handled, the triggering one first
    sockname: tuple[str, int] = ("", 0)  # the node's address the client reached (management's host, port)
    tls: tuple[str, str] | None = None  # (TLS version, cipher) of a relayed TLS connection
    peer_cert: bytes | None = None  # DER of the client certificate its TLS handshake verified

    def encode(self) -> bytes:
        data = msgpack.packb([MARK, VERSION, self.user, self.vhost, self.frame_max, self.heartbeat_s,
                              self.client_properties, self.auth_mechanism, list(self.peer), self.name,
                              self.connected_at_ms, self.deliver_version, self.correlation,
                              list(self.advertised), self.unread, list(self.sockname),
                              None if self.tls is None else list(self.tls), self.peer_cert], use_bin_type=True)
        assert isinstance(data, bytes)
        return data

    @classmethod
    def decode(cls, data: bytes) -> StreamHandoverState:
        """The state `encode` made; ValueError if it is not one (or too large)."""
        v = unpack_state(data, "stream connection")
        if not isinstance(v, list) or len(v) != 18 or v[0] != MARK or v[1] != VERSION:
            raise ValueError("not a stream handover state of this version")
        (_, _, user, vhost, frame_max, heartbeat_s, props, mechanism, peer, name, connected_at, deliver_version,
         correlation, advertised, unread, sockname, tls, peer_cert) = v
        if not all(isinstance(s, str) for s in (user, vhost, mechanism, name)):
            raise ValueError("malformed stream handover state: names")
        if not all(type(n) is int and 0 <= n < 1 << 63 for n in (frame_max, heartbeat_s, connected_at, correlation)):
            raise ValueError("malformed stream handover state: numbers")
        if deliver_version not in (1, 2) or not isinstance(unread, bytes):
            raise ValueError("malformed stream handover state: fields")
        if not (isinstance(props, dict) and all(isinstance(k, str) and isinstance(x, str) for k, x in props.items())):
            raise ValueError("malformed stream handover state: client properties")
        check_identity("stream handover state", [peer, advertised, sockname], tls, peer_cert)
        return cls(user, vhost, frame_max, heartbeat_s, props, mechanism, (peer[0], peer[1]), name, connected_at,
                   deliver_version, correlation, (advertised[0], advertised[1]), unread, (sockname[0], sockname[1]),
                   None if tls is None else (tls[0], tls[1]), peer_cert)


def is_stream_state(data: bytes) -> bool:
    """Whether a handed over connection's state is a stream connection's (else an AMQP one's): msgpack of
    a list (a one-byte header up to 15 fields, three bytes up to 65,535) whose first field is `MARK`."""
    if len(data) > len(_MARK_BYTES) and 0x90 <= data[0] <= 0x9F:
        return data[1:1 + len(_MARK_BYTES)] == _MARK_BYTES
    return len(data) > 3 + len(_MARK_BYTES) and data[0] == 0xDC and data[3:3 + len(_MARK_BYTES)] == _MARK_BYTES
