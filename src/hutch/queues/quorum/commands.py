"""The commands of the quorum queue machine: constructors and the log-entry codec.

Owns: one NamedTuple per command, the `make_*` constructors that check their arguments (a bad command
must never reach the log: every replica would have to fail on it), `encode` (command + the leader's
time -> the bytes of one raft entry), `decode` (the inverse) and `payload_of` (the message bytes an
enqueue or requeue entry carries, for the runtime to read a body back from the log) and `payloads_of`
(every message of an entry, batches included).

Entry layout (version 1):

    version:u8 | header_len:u32 big-endian | msgpack([system_time_ms, opcode, field...]) | payload

Only Enqueue, Requeue and EnqueueBatch have a payload: the message (a batch: the messages back to back)
as the runtime stores it (properties, routing information and body, opaque here). It sits after the
header so that `decode` never copies it: the machine sees a memoryview and keeps nothing of it. Consumer keys and publisher ids are str, int or
tuples of those (msgpack arrays decode back to tuples, so they stay hashable).

Rules:
- `system_time_ms` is stamped by the proposer from the leader's clock (the runtime's job); every replica
  computes expiry from that stamp, never from its own clock.
- Opcodes are never reused; a new field goes at the end with a default, and an entry of an unknown
  version is refused with `CommandError` (the same on every replica).
- A publisher's enqueues must be applied in seq order: after a leader change the runtime resends the
  unconfirmed ones, in order, before any new one (a seq at or below the publisher's last is a duplicate).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

from .config import QuorumConfig
from .messages import BATCH_MAX

VERSION = 1
_HEAD = struct.Struct(">BI")
_MAX_U32 = 2**32 - 1
_MAX_SEQ = 2**63 - 1


class CommandError(ValueError):
    """A malformed command or entry."""


class Enqueue(NamedTuple):
    publisher_id: Any  # None: untracked (no confirms, no deduplication)
    seq: int  # the publisher's sequence number (>= 1), 0 when untracked
    size_bytes: int  # body size: what max-length-bytes counts
    ttl_ms: int | None  # the message's own TTL (expiration property); None: only the queue's applies
    priority: int = 0  # the message's priority property (above HIGH_PRIORITY_ABOVE: high)
    payload: bytes | memoryview = b""


class EnqueueBatch(NamedTuple):
    """Up to BATCH_MAX publishes of one publisher, seqs first_seq, first_seq + 1, ... in one entry: the
    message at position i has body size sizes[i], TTL ttls[i] (ttls None: none has one) and its bytes
    are payload[sum(lens[:i]):sum(lens[:i + 1])]; priority priorities[i] (None: all 0)."""

    publisher_id: Any
    first_seq: int
    sizes: tuple[int, ...]
    ttls: tuple[int | None, ...] | None
    lens: tuple[int, ...]
    priorities: tuple[int, ...] | None = None
    payload: bytes | memoryview = b""


class RegisterPublisher(NamedTuple):
    publisher_id: Any
    node: str


class UnregisterPublisher(NamedTuple):
    publisher_id: Any


class Checkout(NamedTuple):
    consumer_key: Any
    prefetch: int
    auto_ack: bool
    priority: int
    tag: str
    node: str
    channel: str


class Cancel(NamedTuple):
    consumer_key: Any


class Settle(NamedTuple):
    consumer_key: Any
    msg_ids: tuple[int, ...]


class Return(NamedTuple):
    consumer_key: Any
    msg_ids: tuple[int, ...]


class Discard(NamedTuple):
    consumer_key: Any
    msg_ids: tuple[int, ...]


class Requeue(NamedTuple):
    consumer_key: Any
    msg_id: int
    payload: bytes | memoryview = b""


class Credit(NamedTuple):
    consumer_key: Any
    credit: int


class Down(NamedTuple):
    owner: str  # a channel or a node
    reason: str  # "down" or "noconnection"


class Dequeue(NamedTuple):
    consumer_key: Any
    settled: bool
    node: str
    channel: str


class Purge(NamedTuple):
    pass


class Touch(NamedTuple):
    pass


class Tick(NamedTuple):
    now_ms: int


class UpdateConfig(NamedTuple):
    config: QuorumConfig


class DlxCheckout(NamedTuple):
    prefetch: int


class DlxSettle(NamedTuple):
    msg_ids: tuple[int, ...]


Command = (Enqueue | EnqueueBatch | RegisterPublisher | UnregisterPublisher | Checkout | Cancel | Settle
           | Return | Discard | Requeue | Credit | Down | Dequeue | Purge | Touch | Tick | UpdateConfig | DlxCheckout | DlxSettle)

DOWN_REASONS = ("down", "noconnection")
DLX_PREFETCH_DEFAULT = 32  # dead_letter_worker_consumer_prefetch (seed 000)


# -- constructors --------------------------------------------------------------------------------------
def _int(name: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    if type(value) is not int or value < minimum or (maximum is not None and value > maximum):
        raise CommandError(f"{name} must be an integer >= {minimum}, not {value!r}")
    return value


def _key(name: str, value: Any) -> Any:
    if isinstance(value, str | int) and not isinstance(value, bool):
        return value
    if isinstance(value, tuple) and all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
        return value
    raise CommandError(f"{name} must be a str, an int or a tuple of those, not {value!r}")


def _ids(msg_ids: Any) -> tuple[int, ...]:
    ids = tuple(msg_ids)
    for i in ids:
        _int("msg id", i)
    return ids


def make_enqueue(publisher_id: Any, seq: int, size_bytes: int, ttl_ms: int | None = None,
                 payload: bytes = b"", priority: int = 0) -> Enqueue:
    """Publish one message. `publisher_id` None: untracked (no confirm, no deduplication, seq ignored).
    `priority`: the message's priority property (0-255; above 4 it is delivered as high priority)."""
    if publisher_id is not None:
        _key("publisher_id", publisher_id)
        _int("seq", seq, 1, _MAX_SEQ)
    else:
        seq = 0
    _int("size_bytes", size_bytes, 0, _MAX_U32)
    if ttl_ms is not None:
        _int("ttl_ms", ttl_ms)
    _int("priority", priority, 0, 255)
    return Enqueue(publisher_id, seq, size_bytes, ttl_ms, priority, payload)


def make_enqueue_batch(publisher_id: Any, first_seq: int, sizes: Any, ttls: Any, lens: Any,
                       payload: bytes, priorities: Any = None) -> EnqueueBatch:
    """Publish len(sizes) messages (1..BATCH_MAX) of one publisher in one entry: seqs from `first_seq`.
    `payload` is the messages' bytes back to back, `lens` their lengths; `ttls` None when no message has
    a TTL of its own. `publisher_id` None: untracked (first_seq ignored)."""
    sizes, lens = tuple(sizes), tuple(lens)
    n = len(sizes)
    if not 1 <= n <= BATCH_MAX:
        raise CommandError(f"a batch holds 1 to {BATCH_MAX} messages, not {n}")
    if len(lens) != n or (ttls is not None and len(ttls) != n) or (priorities is not None and len(priorities) != n):
        raise CommandError("sizes, ttls, lens and priorities must be as long as each other")
    if priorities is not None:
        priorities = tuple(priorities)
        for v in priorities:
            _int("priority", v, 0, 255)
    if publisher_id is not None:
        _key("publisher_id", publisher_id)
        _int("first_seq", first_seq, 1, _MAX_SEQ - n + 1)
    else:
        first_seq = 0
    for v in sizes:
        _int("size_bytes", v, 0, _MAX_U32)
    for v in lens:
        _int("payload length", v, 0, _MAX_U32)
    if sum(lens) != len(payload):
        raise CommandError(f"payload is {len(payload)} bytes, lens say {sum(lens)}")
    if ttls is not None:
        ttls = tuple(ttls)
        for v in ttls:
            if v is not None:
                _int("ttl_ms", v)
    return EnqueueBatch(publisher_id, first_seq, sizes, ttls, lens, priorities, payload)


def make_register_publisher(publisher_id: Any, node: str = "") -> RegisterPublisher:
    return RegisterPublisher(_key("publisher_id", publisher_id), node)


def make_unregister_publisher(publisher_id: Any) -> UnregisterPublisher:
    return UnregisterPublisher(_key("publisher_id", publisher_id))


def make_checkout(consumer_key: Any, prefetch: int, auto_ack: bool = False, priority: int = 0, tag: str = "",
                  node: str = "", channel: str = "") -> Checkout:
    """basic.consume (or a change of its prefetch/priority). prefetch 0: unlimited (UNLIMITED_PREFETCH)."""
    return Checkout(_key("consumer_key", consumer_key), _int("prefetch", prefetch), bool(auto_ack),
                    _int("priority", priority, -(2**63)), tag, node, channel)


def make_cancel(consumer_key: Any) -> Cancel:
    return Cancel(_key("consumer_key", consumer_key))


def make_settle(consumer_key: Any, msg_ids: Any) -> Settle:
    """basic.ack of these messages."""
    return Settle(_key("consumer_key", consumer_key), _ids(msg_ids))


def make_return(consumer_key: Any, msg_ids: Any) -> Return:
    """basic.nack/reject with requeue: a failed delivery each; the messages keep their log entries."""
    return Return(_key("consumer_key", consumer_key), _ids(msg_ids))


def make_requeue(consumer_key: Any, msg_id: int, payload: bytes) -> Requeue:
    """A return that re-appends the message: it lives on at this command's entry (a new msg id), so its
    old entry can be truncated. What the runtime proposes for a requeue when no delivery limit is set."""
    return Requeue(_key("consumer_key", consumer_key), _int("msg_id", msg_id), payload)


def make_discard(consumer_key: Any, msg_ids: Any) -> Discard:
    """basic.nack/reject without requeue: dead-letter `rejected`, or drop."""
    return Discard(_key("consumer_key", consumer_key), _ids(msg_ids))


def make_credit(consumer_key: Any, credit: int) -> Credit:
    """Give an auto-ack consumer `credit` more deliveries (the runtime wrote the earlier ones out)."""
    return Credit(_key("consumer_key", consumer_key), _int("credit", credit))


def make_down(owner: str, reason: str = "down") -> Down:
    """A channel or node is gone. Its consumers are removed and their unacked messages returned (failed
    deliveries). With reason "down" its publishers' deduplication records go too; with "noconnection"
    (a node unreachable, maybe alive) they stay, so a resend after the partition heals is deduplicated."""
    if reason not in DOWN_REASONS:
        raise CommandError(f"reason must be one of {DOWN_REASONS}, not {reason!r}")
    return Down(owner, reason)


def make_dequeue(consumer_key: Any, settled: bool, node: str = "", channel: str = "") -> Dequeue:
    """basic.get. `settled` (auto-ack): the message leaves at once; else it is checked out to
    `consumer_key` (use a key of its own per channel, not a subscription's) until settled."""
    return Dequeue(_key("consumer_key", consumer_key), bool(settled), node, channel)


def make_purge() -> Purge:
    return Purge()


def make_touch() -> Touch:
    """The queue was used (redeclared): restarts the queue TTL (`expires`)."""
    return Touch()


def make_tick(now_ms: int) -> Tick:
    """Proposed periodically by the leader: expires messages, the queue TTL, idle publishers."""
    return Tick(_int("now_ms", now_ms))


def make_update_config(config: QuorumConfig) -> UpdateConfig:
    if not isinstance(config, QuorumConfig):
        raise CommandError("config must be a QuorumConfig")
    return UpdateConfig(config)


def make_dlx_checkout(prefetch: int = DLX_PREFETCH_DEFAULT) -> DlxCheckout:
    """The dead-letter worker (re)registers; its unsettled dead letters are handed out again."""
    return DlxCheckout(_int("prefetch", prefetch, 1))


def make_dlx_settle(msg_ids: Any) -> DlxSettle:
    """The worker's republish of these dead letters was confirmed: they leave the queue."""
    return DlxSettle(_ids(msg_ids))


# -- codec ---------------------------------------------------------------------------------------------
_CLASSES: tuple[type, ...] = (Enqueue, RegisterPublisher, UnregisterPublisher, Checkout, Cancel, Settle,
                              Return, Discard, Requeue, Credit, Down, Dequeue, Purge, Touch, Tick,
                              UpdateConfig, DlxCheckout, DlxSettle, EnqueueBatch)
_OPCODES: dict[type, int] = {cls: op for op, cls in enumerate(_CLASSES)}
_BATCH = _OPCODES[EnqueueBatch]
_PAYLOAD_CLASSES = (Enqueue, Requeue, EnqueueBatch)
_WITH_PAYLOAD = frozenset(_OPCODES[cls] for cls in _PAYLOAD_CLASSES)
_UPDATE_CONFIG = _OPCODES[UpdateConfig]
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def encode(command: Command, system_time_ms: int = 0) -> bytes:
    """The raft entry for `command`, stamped with the leader's time."""
    op = _OPCODES[type(command)]
    if isinstance(command, _PAYLOAD_CLASSES):
        header = _packb((system_time_ms, op, *command[:-1]))
        return b"".join((_HEAD.pack(VERSION, len(header)), header, command.payload))
    if isinstance(command, UpdateConfig):
        header = _packb((system_time_ms, op, command.config.to_wire()))
    else:
        header = _packb((system_time_ms, op, *command))
    return _HEAD.pack(VERSION, len(header)) + header


def decode(data: bytes | memoryview) -> tuple[int, Command]:
    """(system_time_ms, command) of a raft entry. Raises CommandError for a malformed entry."""
    try:
        version, length = _HEAD.unpack_from(data, 0)
        if version != VERSION:
            raise CommandError(f"unknown quorum command version {version}")
        view = memoryview(data)
        end = _HEAD.size + length
        header = msgpack.unpackb(view[_HEAD.size:end], use_list=False, raw=False)
        system_time_ms, op = header[0], header[1]
        cls = _CLASSES[op]
        if op in _WITH_PAYLOAD:  # by keyword: entries written before a field was added lack it
            return system_time_ms, cls(*header[2:], payload=view[end:])
        if op == _UPDATE_CONFIG:
            return system_time_ms, UpdateConfig(QuorumConfig.from_wire(header[2]))
        return system_time_ms, cls(*header[2:])
    except CommandError:
        raise
    except (ValueError, TypeError, IndexError, struct.error, msgpack.UnpackException) as exc:
        raise CommandError(f"malformed quorum command: {exc}") from exc


def payload_of(data: bytes | memoryview) -> memoryview:
    """The payload (the message bytes) of an Enqueue or Requeue entry, without copying."""
    _version, length = _HEAD.unpack_from(data, 0)
    return memoryview(data)[_HEAD.size + length:]


def payloads_of(data: bytes | memoryview) -> list[memoryview]:
    """The message bytes of an Enqueue, Requeue or EnqueueBatch entry, by position, without copying.
    Raises CommandError for an entry of another kind."""
    _t, cmd = decode(data)
    if type(cmd) is EnqueueBatch:
        view, out, at = memoryview(cmd.payload), [], 0
        for n in cmd.lens:
            out.append(view[at:at + n])
            at += n
        return out
    if type(cmd) is Enqueue or type(cmd) is Requeue:
        return [memoryview(cmd.payload)]  # decode's payload is already a view: no copy
    raise CommandError(f"a {type(cmd).__name__} entry carries no message")
