"""The inter-node wire format, sans-I/O: frames, batches, and the authenticated handshake.

Owns:
- Framing: a frame is a 4-byte big-endian payload length followed by one msgpack value
  (`use_bin_type=True`; decoded with `raw=False`, `strict_map_key=False`). `FrameDecoder.feed(bytes)`
  returns every complete value, judging a frame's size from its header before buffering the payload.
- Batches: after the handshake every frame is a msgpack array of entries, each a small array whose first
  element is its kind (`MESSAGE`, `REQUEST`, `REPLY`, `ERROR`). Entries are packed once, when the caller
  sends them; a batch is then a length header, an array header and the packed entries side by side, so
  the writer never re-encodes (`batch_header`). The empty batch is the heartbeat (`HEARTBEAT_FRAME`).
- The handshake (`Handshake`): the dialler sends HELLO, the acceptor answers with its own HELLO, the
  dialler sends PROOF = HMAC-SHA256(secret, dialler label + transcript), the acceptor checks it and
  sends WELCOME = HMAC-SHA256(secret, acceptor label + transcript), which the dialler checks. The
  transcript is the canonical encoding of both HELLOs, so each MAC covers both random nonces, both
  node names and both advertised addresses; each side proves knowledge of the secret over a nonce the
  other side chose, and the secret itself never crosses the wire. Either side may answer REFUSED.

Rules: no sockets, no asyncio, no clocks, no randomness (nonces are arguments). `FrameDecoder` raises only
`WireError` subclasses (carrying the good values decoded before the bad frame) and stays broken after the
first one; `Handshake.receive` raises only
`HandshakeFailed`. MACs are compared with `hmac.compare_digest`. Frames before the handshake completes are
bounded by `HANDSHAKE_MAX_FRAME_BYTES`, so an unauthenticated socket cannot make a node buffer much.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

PROTOCOL = "hutch-cluster"
VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
HANDSHAKE_MAX_FRAME_BYTES = 4096
"""Bound on any frame received before the peer has proved the secret."""
MIN_FRAME_BYTES = 4096
"""The smallest `max_frame_bytes` a node may advertise (a handshake frame must fit)."""
MAX_NODE_NAME_CHARS = 255

_LEN = struct.Struct(">I")
_MAX_LEN = (1 << 32) - 1

# entry kinds (first element of every entry in a batch)
MESSAGE = 0  # [0, obj]                      fire and forget
REQUEST = 1  # [1, request_id, obj]          expects REPLY or ERROR with the same id
REPLY = 2  # [2, request_id, obj]
ERROR = 3  # [3, request_id, type_name, message]  the request handler raised

_DIALLER_LABEL = b"hutch-cluster/1 dialler proof\x00"
_ACCEPTOR_LABEL = b"hutch-cluster/1 acceptor proof\x00"

_packer = msgpack.Packer(use_bin_type=True)


class WireError(Exception):
    """Anything wrong with bytes received from a peer; the connection must be closed.

    When `FrameDecoder.feed` raises, `values` holds the values of the good frames that came before the
    bad one in that same feed, so the caller can still act on them before closing.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.values: list[Any] = []


class FrameTooLarge(WireError):
    """A frame header announced more than the decoder's `max_frame_bytes`."""


class MalformedFrame(WireError):
    """A frame's payload is not one well-formed msgpack value, or not what the protocol expects there."""


class Reason(enum.Enum):
    """Why a handshake failed; the value is what REFUSED carries on the wire."""

    SECRET = "secret"  # a MAC did not verify: the two nodes do not share the cluster secret
    NAME_CLASH = "name-clash"  # the peer claims our own node name
    UNEXPECTED_NODE = "unexpected-node"  # we dialled an address for node X and found node Y
    VERSION = "version"  # protocol or version we do not speak
    PROTOCOL = "protocol"  # a message out of order or with bad fields
    DUPLICATE = "duplicate"  # a connection between the two nodes already exists and wins (not an error)


REASON_TEXT = {
    Reason.SECRET: "cluster secret mismatch",
    Reason.NAME_CLASH: "node name clash (it claims our own node name)",
    Reason.UNEXPECTED_NODE: "unexpected node name",
    Reason.VERSION: "unsupported protocol version",
    Reason.PROTOCOL: "inter-node protocol violation",
    Reason.DUPLICATE: "a connection between these nodes already exists",
}


class HandshakeFailed(WireError):
    """The handshake cannot complete.

    `reason` says why; `by_peer` is True when the other side sent REFUSED (we did nothing wrong that we
    can see), False when we detected the problem. `reply` is the frame to write before closing (a
    REFUSED telling the peer why), or None. `str(exc)` is a human-readable detail.
    """

    def __init__(self, reason: Reason, detail: str, *, by_peer: bool = False, reply: bytes | None = None):
        super().__init__(detail)
        self.reason = reason
        self.by_peer = by_peer
        self.reply = reply


# -- frames ----------------------------------------------------------------------------------------


def pack(obj: Any) -> bytes:
    """msgpack-encode one value (TypeError if it is not msgpack-able)."""
    return _packer.pack(obj)


def encode_frame(obj: Any) -> bytes:
    payload = _packer.pack(obj)
    return _LEN.pack(len(payload)) + payload


def decode_payload(payload: bytes | memoryview) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises ValueError subclasses, TypeError (unhashable keys), ...
        raise MalformedFrame(f"undecodable frame payload ({type(exc).__name__}: {exc})") from None


class FrameDecoder:
    """Incremental frame parser: `feed(data)` returns the values of every frame completed by `data`.

    Invariant: `_buf` holds the bytes received and not yet returned as a value; it never holds more than
    one header, one partial frame of at most `max_frame_bytes`, and the rest of the last chunk fed.
    `max_frame_bytes` may be raised between feeds (after the handshake).
    """

    __slots__ = ("_buf", "_error", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int) -> None:
        self._buf = bytearray()
        self._error: WireError | None = None
        self.max_frame_bytes = max_frame_bytes

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        if self._error is not None:
            self._error.values = []
            raise self._error
        buf = self._buf
        buf += data
        out: list[Any] = []
        n = len(buf)
        pos = 0
        try:
            with memoryview(buf) as view:
                while n - pos >= 4:
                    (size,) = _LEN.unpack_from(view, pos)
                    if size > self.max_frame_bytes:
                        raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {self.max_frame_bytes}")
                    end = pos + 4 + size
                    if end > n:
                        break
                    out.append(decode_payload(view[pos + 4 : end]))
                    pos = end
        except WireError as exc:
            exc.values = out
            self._error = exc
            # a payload view may still be referenced by the exception's traceback: drop, don't resize
            self._buf = bytearray()
            raise
        if pos:
            del buf[:pos]
        return out


# -- batches ---------------------------------------------------------------------------------------

HEARTBEAT_FRAME = encode_frame([])
"""An empty batch: sent when a connection has been idle for a heartbeat interval."""

_ARRAY16 = struct.Struct(">BH")
_ARRAY32 = struct.Struct(">BI")
BATCH_OVERHEAD_BYTES = 4 + 5
"""Most bytes a batch adds around its entries (length header + array header)."""


def batch_header(n_entries: int, entries_bytes: int) -> bytes:
    """The frame length and msgpack array header that precede `n_entries` packed entries."""
    if n_entries < 16:
        arr = bytes((0x90 | n_entries,))
    elif n_entries < 1 << 16:
        arr = _ARRAY16.pack(0xDC, n_entries)
    else:
        arr = _ARRAY32.pack(0xDD, n_entries)
    return _LEN.pack(len(arr) + entries_bytes) + arr


def batch_parts(entries: list[bytes], frame_bytes: int) -> list[bytes]:
    """The buffers to write (`writelines`) for packed `entries`: batch frames of at most `frame_bytes`
    each, in order. Invariant: every entry is at most `frame_bytes - BATCH_OVERHEAD_BYTES` long (the
    sender checks when it packs), so one entry always fits a frame of its own."""
    target = frame_bytes - BATCH_OVERHEAD_BYTES
    total = 0
    for entry in entries:
        total += len(entry)
    if total <= target:  # the common case: one frame, no copying
        return [batch_header(len(entries), total), *entries]
    parts: list[bytes] = []
    batch: list[bytes] = []
    size = 0
    for entry in entries:
        if batch and size + len(entry) > target:
            parts.append(batch_header(len(batch), size))
            parts.extend(batch)
            batch, size = [], 0
        batch.append(entry)
        size += len(entry)
    parts.append(batch_header(len(batch), size))
    parts.extend(batch)
    return parts


def encode_batch(entries: list[bytes]) -> bytes:
    """One frame holding packed `entries` (the writer uses `batch_header` and `writelines` instead)."""
    total = sum(map(len, entries))
    return batch_header(len(entries), total) + b"".join(entries)


_MESSAGE_PREFIX = b"\x92\x00"  # fixarray(2), MESSAGE
_REQUEST_PREFIX = b"\x93\x01"  # fixarray(3), REQUEST
_REPLY_PREFIX = b"\x93\x02"  # fixarray(3), REPLY
_ERROR_PREFIX = b"\x94\x03"  # fixarray(4), ERROR


def pack_message(obj: Any) -> bytes:
    return _MESSAGE_PREFIX + _packer.pack(obj)


def pack_message_raw(payload: bytes) -> bytes:
    """A MESSAGE entry around `payload`, a value already msgpack-encoded (`hutch.cluster.messages.encode`)."""
    return _MESSAGE_PREFIX + payload


def pack_request(request_id: int, obj: Any) -> bytes:
    return _REQUEST_PREFIX + _packer.pack(request_id) + _packer.pack(obj)


def pack_request_raw(request_id: int, payload: bytes) -> bytes:
    """A REQUEST entry around `payload`, a value already msgpack-encoded."""
    return _REQUEST_PREFIX + _packer.pack(request_id) + payload


def pack_reply(request_id: int, obj: Any) -> bytes:
    return _REPLY_PREFIX + _packer.pack(request_id) + _packer.pack(obj)


def pack_error(request_id: int, type_name: str, message: str) -> bytes:
    return _ERROR_PREFIX + _packer.pack(request_id) + _packer.pack(type_name) + _packer.pack(message)


# -- handshake -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """What each side says about itself. `host`/`port` are where it listens for inter-node connections."""

    node: str
    host: str
    port: int
    nonce: bytes
    max_frame_bytes: int
    version: int = VERSION

    def to_wire(self) -> dict[str, Any]:
        return {"t": "hello", "proto": PROTOCOL, "v": self.version, "node": self.node, "host": self.host,
                "port": self.port, "nonce": self.nonce, "max_frame": self.max_frame_bytes}

    def canonical(self) -> list[Any]:
        return [self.version, self.node, self.host, self.port, self.nonce, self.max_frame_bytes]


def encode_refused(reason: Reason, text: str = "") -> bytes:
    return encode_frame({"t": "refused", "reason": reason.value, "text": text[:500]})


def _field(msg: dict[str, Any], key: str, typ: type) -> Any:
    value = msg.get(key)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise HandshakeFailed(Reason.PROTOCOL, f"handshake field {key!r} missing or not {typ.__name__}",
                              reply=encode_refused(Reason.PROTOCOL, f"bad field {key}"))
    return value


def parse_hello(msg: dict[str, Any]) -> Hello:
    if msg.get("proto") != PROTOCOL:
        raise HandshakeFailed(Reason.PROTOCOL, f"not a {PROTOCOL} peer",
                              reply=encode_refused(Reason.PROTOCOL, f"expected {PROTOCOL}"))
    version = _field(msg, "v", int)
    if version != VERSION:
        raise HandshakeFailed(Reason.VERSION, f"peer speaks {PROTOCOL} version {version}, we speak {VERSION}",
                              reply=encode_refused(Reason.VERSION, f"we speak version {VERSION}"))
    node = _field(msg, "node", str)
    host = _field(msg, "host", str)
    port = _field(msg, "port", int)
    nonce = _field(msg, "nonce", bytes)
    max_frame = _field(msg, "max_frame", int)
    if not 0 < len(node) <= MAX_NODE_NAME_CHARS or not 16 <= len(nonce) <= 64 or not 0 <= port < 65536 \
            or max_frame < MIN_FRAME_BYTES or len(host) > 255:
        raise HandshakeFailed(Reason.PROTOCOL, "handshake field out of range",
                              reply=encode_refused(Reason.PROTOCOL, "field out of range"))
    return Hello(node, host, port, nonce, max_frame, version)


def transcript(dialler: Hello, acceptor: Hello) -> bytes:
    """The bytes both MACs cover: both HELLOs, canonically encoded (msgpack is unambiguous)."""
    return _packer.pack([PROTOCOL, dialler.canonical(), acceptor.canonical()])


def dialler_proof(secret: bytes, dialler: Hello, acceptor: Hello) -> bytes:
    return hmac.new(secret, _DIALLER_LABEL + transcript(dialler, acceptor), hashlib.sha256).digest()


def acceptor_proof(secret: bytes, dialler: Hello, acceptor: Hello) -> bytes:
    return hmac.new(secret, _ACCEPTOR_LABEL + transcript(dialler, acceptor), hashlib.sha256).digest()


def verify_mac(expected: bytes, received: Any) -> bool:
    return isinstance(received, bytes) and len(received) == MAC_BYTES and hmac.compare_digest(expected, received)


class Role(enum.Enum):
    DIALLER = "dialler"
    ACCEPTOR = "acceptor"


class HandshakeState(enum.Enum):
    START = "start"  # dialler: HELLO not sent yet
    AWAIT_HELLO = "await-hello"
    AWAIT_PROOF = "await-proof"  # acceptor
    VERIFIED = "verified"  # acceptor: the dialler proved the secret; the runtime decides accept() or refuse
    AWAIT_WELCOME = "await-welcome"  # dialler
    DONE = "done"
    FAILED = "failed"


class Handshake:
    """One side of the handshake of one connection.

    Dialler: `start()` -> HELLO frame; `receive(hello)` -> PROOF frame; `receive(welcome)` -> None, DONE.
    Acceptor: `receive(hello)` -> HELLO frame; `receive(proof)` -> None, VERIFIED; then the runtime calls
    `accept()` -> WELCOME frame (DONE), or writes `encode_refused(...)` and closes.
    Any failure raises `HandshakeFailed` and leaves the state FAILED. `peer` is the peer's HELLO once known.
    """

    def __init__(self, role: Role, *, node: str, secret: bytes, nonce: bytes, host: str, port: int,
                 max_frame_bytes: int, expected_node: str | None = None,
                 answers_as: Callable[[str, str], bool] | None = None) -> None:
        if not secret:
            raise ValueError("the cluster secret must not be empty")
        self.role = role
        self.hello = Hello(node, host, port, nonce, max_frame_bytes)
        self.expected_node = expected_node
        # (expected, found) -> whether the node dialled as `expected` may answer as `found` (a join seed
        # `n1@host` answering as its worker 0 `n1@host#w0`); default: only as itself
        self.answers_as = answers_as
        self.peer: Hello | None = None
        self.state = HandshakeState.START if role is Role.DIALLER else HandshakeState.AWAIT_HELLO
        self._secret = secret

    @property
    def done(self) -> bool:
        return self.state is HandshakeState.DONE

    def start(self) -> bytes:
        if self.state is not HandshakeState.START:
            raise RuntimeError("start() is for a dialler, once")
        self.state = HandshakeState.AWAIT_HELLO
        return encode_frame(self.hello.to_wire())

    def receive(self, msg: Any) -> bytes | None:
        try:
            return self._receive(msg)
        except HandshakeFailed:
            self.state = HandshakeState.FAILED
            raise

    def accept(self) -> bytes:
        if self.state is not HandshakeState.VERIFIED or self.peer is None:
            raise RuntimeError("accept() before the dialler's proof verified")
        self.state = HandshakeState.DONE
        return encode_frame({"t": "welcome", "mac": acceptor_proof(self._secret, self.peer, self.hello)})

    def _receive(self, msg: Any) -> bytes | None:
        t = msg.get("t") if isinstance(msg, dict) else None
        if t == "refused":
            try:
                reason = Reason(msg.get("reason"))
            except ValueError:
                reason = Reason.PROTOCOL
            text = msg.get("text")
            raise HandshakeFailed(reason, text if isinstance(text, str) else "", by_peer=True)
        state = self.state
        if state is HandshakeState.AWAIT_HELLO and t == "hello":
            return self._on_hello(parse_hello(msg))
        if state is HandshakeState.AWAIT_PROOF and t == "proof":
            assert self.peer is not None
            if not verify_mac(dialler_proof(self._secret, self.peer, self.hello), msg.get("mac")):
                raise HandshakeFailed(Reason.SECRET, REASON_TEXT[Reason.SECRET],
                                      reply=encode_refused(Reason.SECRET, "cluster secret mismatch"))
            self.state = HandshakeState.VERIFIED
            return None
        if state is HandshakeState.AWAIT_WELCOME and t == "welcome":
            assert self.peer is not None
            if not verify_mac(acceptor_proof(self._secret, self.hello, self.peer), msg.get("mac")):
                raise HandshakeFailed(Reason.SECRET, "it failed to prove the cluster secret",
                                      reply=encode_refused(Reason.SECRET, "cluster secret mismatch"))
            self.state = HandshakeState.DONE
            return None
        raise HandshakeFailed(Reason.PROTOCOL, f"unexpected handshake message {t!r} in state {state.value}",
                              reply=encode_refused(Reason.PROTOCOL, "unexpected handshake message"))

    def _on_hello(self, peer: Hello) -> bytes:
        self.peer = peer
        if peer.node == self.hello.node:
            raise HandshakeFailed(Reason.NAME_CLASH, REASON_TEXT[Reason.NAME_CLASH],
                                  reply=encode_refused(Reason.NAME_CLASH, f"node name {peer.node!r} is ours"))
        if self.role is Role.ACCEPTOR:
            self.state = HandshakeState.AWAIT_PROOF
            return encode_frame(self.hello.to_wire())
        if self.expected_node is not None and peer.node != self.expected_node and not (
                self.answers_as is not None and self.answers_as(self.expected_node, peer.node)):
            raise HandshakeFailed(Reason.UNEXPECTED_NODE,
                                  f"expected node {self.expected_node!r} there, found {peer.node!r}",
                                  reply=encode_refused(Reason.UNEXPECTED_NODE, f"expected {self.expected_node}"))
        self.state = HandshakeState.AWAIT_WELCOME
        return encode_frame({"t": "proof", "mac": dialler_proof(self._secret, self.hello, peer)})
