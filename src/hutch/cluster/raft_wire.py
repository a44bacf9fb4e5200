"""Raft messages on the wire: compact msgpack-able values for `hutch.raft.Message` and the per-peer batch.

This module owns the format of everything one node's Raft driver sends another (runtime/clustering/raft_driver.py):

- `encode_message(m)` / `decode_message(v)`: one `Message` as a flat list
  `[type, to, sender, term, log_term, index, commit, reject, reject_hint, campaign, entries, snapshot]`
  with trailing default fields left off (a vote answer is 4 small ints). `entries` is one flat list
  `[first_index, term, type, data, term, type, data, ...]` (the entries of a message are consecutive, so
  their indexes are implied); `snapshot` is `[index, term, [voter, ...], data]`; `campaign` is 0 for none.
- `PeerBatch` / `decode_batch`: everything for one peer of one driver cycle, for every Raft group:
  `[VERSION, heartbeats, heartbeat_responses, messages, quiesce]`, where `heartbeats` is the flat list
  `[gid, term, commit, ...]`, `heartbeat_responses` is `[gid, term, ...]`, `messages` is
  `[gid, encoded_message, ...]` and `quiesce` is `[gid, term, commit, ...]` (a heartbeat after which a
  caught-up follower stops ticking, docs/raft.md "The driver"). Heartbeats and their answers carry only
  (term, commit), so a tick of thousands of groups is one payload of a few bytes per group; the sender and
  receiver of a coalesced heartbeat are the peers the payload travels between.

Rules:
- Values only: lists (tuples on encode), non-negative ints, bytes. No dicts, no strings.
- Decoding trusts nothing: any value that is not exactly what `encode_*` makes raises `RaftWireError`
  (never another exception), so a transport may feed it whatever arrived.
- `decode(encode(x)) == x` for every value the Raft core produces (a Hypothesis round trip checks it).

Pure: stdlib and `hutch.raft` only.
"""

from __future__ import annotations

from typing import Any

from hutch.raft.messages import (
    CampaignType,
    ConfState,
    Entry,
    EntryType,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

VERSION = 1
MAX_INT = (1 << 64) - 1

_HB = MessageType.HEARTBEAT
_HB_RESP = MessageType.HEARTBEAT_RESP
_MESSAGE_TYPES = {int(t): t for t in MessageType}
_ENTRY_TYPES = {int(t): t for t in EntryType}
_CAMPAIGNS = {int(t): t for t in CampaignType}


class RaftWireError(ValueError):
    """A value that is not a valid encoded Raft message or batch."""


# -- one message ------------------------------------------------------------------------------------------
def encode_entries(entries: tuple[Entry, ...] | list[Entry]) -> list[Any]:
    """`[first_index, term, type, data, ...]`; the entries must have consecutive indexes."""
    if not entries:
        return []
    first = entries[0].index
    out: list[Any] = [first]
    for i, e in enumerate(entries):
        if e.index != first + i:
            raise ValueError(f"entries are not consecutive: {e.index} after {first + i - 1}")
        out.append(e.term)
        out.append(int(e.type))
        out.append(e.data)
    return out


def encode_snapshot(snap: Snapshot) -> list[Any]:
    return [snap.meta.index, snap.meta.term, list(snap.meta.conf_state.voters), snap.data]


def encode_message(m: Message) -> list[Any]:
    v: list[Any] = [
        int(m.type),
        m.to,
        m.sender,
        m.term,
        m.log_term,
        m.index,
        m.commit,
        1 if m.reject else 0,
        m.reject_hint,
        0 if m.campaign is None else int(m.campaign),
        encode_entries(m.entries),
        None if m.snapshot is None else encode_snapshot(m.snapshot),
    ]
    if v[11] is None:
        v.pop()
        while len(v) > 3 and not v[-1]:  # 0 and [] are the defaults of every optional field
            v.pop()
    return v


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= MAX_INT:
        raise RaftWireError(f"{what}: expected an unsigned 64-bit int, got {v!r:.60}")
    return v


def _bytes(v: Any, what: str) -> bytes:
    if type(v) is not bytes:
        raise RaftWireError(f"{what}: expected bytes, got {type(v).__name__}")
    return v


def _seq(v: Any, what: str) -> list[Any] | tuple[Any, ...]:
    if type(v) is not list and type(v) is not tuple:
        raise RaftWireError(f"{what}: expected a list, got {type(v).__name__}")
    return v


def decode_entries(v: Any) -> tuple[Entry, ...]:
    v = _seq(v, "entries")
    if not v:
        return ()
    if len(v) % 3 != 1:
        raise RaftWireError(f"entries: bad length {len(v)}")
    index = _int(v[0], "entry index")
    if index == 0 or index + len(v) // 3 - 1 > MAX_INT:
        raise RaftWireError(f"entries: bad first index {index}")
    out = []
    for pos in range(1, len(v), 3):
        kind = _ENTRY_TYPES.get(v[pos + 1]) if type(v[pos + 1]) is int else None
        if kind is None:
            raise RaftWireError(f"entry type: {v[pos + 1]!r:.60}")
        out.append(Entry(_int(v[pos], "entry term"), index, kind, _bytes(v[pos + 2], "entry data")))
        index += 1
    return tuple(out)


def decode_snapshot(v: Any) -> Snapshot:
    v = _seq(v, "snapshot")
    if len(v) != 4:
        raise RaftWireError(f"snapshot: expected 4 fields, got {len(v)}")
    voters = tuple(_int(x, "voter") for x in _seq(v[2], "voters"))
    if list(voters) != sorted(set(voters)) or 0 in voters:
        raise RaftWireError("snapshot: voters must be sorted, distinct and positive")
    meta = SnapshotMeta(_int(v[0], "snapshot index"), _int(v[1], "snapshot term"), ConfState(voters))
    return Snapshot(meta, _bytes(v[3], "snapshot data"))


def decode_message(v: Any) -> Message:
    v = _seq(v, "message")
    n = len(v)
    if not 3 <= n <= 12:
        raise RaftWireError(f"message: expected 3..12 fields, got {n}")
    kind = _MESSAGE_TYPES.get(v[0]) if type(v[0]) is int else None
    if kind is None:
        raise RaftWireError(f"message type: {v[0]!r:.60}")
    ints = [_int(x, "message field") for x in v[1:min(n, 10)]]
    ints += [0] * (9 - len(ints))
    to, sender, term, log_term, index, commit, reject, reject_hint, campaign = ints
    if reject > 1:
        raise RaftWireError(f"message reject flag: {reject}")
    camp: CampaignType | None = None
    if campaign:
        camp = _CAMPAIGNS.get(campaign)
        if camp is None:
            raise RaftWireError(f"message campaign: {campaign}")
    entries = decode_entries(v[10]) if n > 10 else ()
    snap = decode_snapshot(v[11]) if n > 11 else None
    return Message(kind, to, sender, term, log_term, index, entries, commit, bool(reject), reject_hint, snap, camp)


# -- the per-peer batch -----------------------------------------------------------------------------------
def _is_bare(m: Message) -> bool:
    """A heartbeat (answer) with nothing but term and commit: coalesced as (gid, term[, commit])."""
    return (not m.entries and m.snapshot is None and m.campaign is None and not m.reject
            and m.log_term == 0 and m.index == 0 and m.reject_hint == 0)


class PeerBatch:
    """What one driver cycle sends one peer, for all groups. Build with `add`/`add_quiesce`; send `payload()`."""

    __slots__ = ("count", "heartbeat_resps", "heartbeats", "messages", "quiesce")

    def __init__(self) -> None:
        self.heartbeats: list[int] = []
        self.heartbeat_resps: list[int] = []
        self.messages: list[Any] = []
        self.quiesce: list[int] = []
        self.count = 0  # Raft messages (and quiesce notices) in the batch

    def add(self, gid: int, m: Message) -> None:
        self.count += 1
        if m.type is _HB and _is_bare(m):
            self.heartbeats += (gid, m.term, m.commit)
        elif m.type is _HB_RESP and m.commit == 0 and _is_bare(m):
            self.heartbeat_resps += (gid, m.term)
        else:
            self.messages += (gid, encode_message(m))

    def add_quiesce(self, gid: int, term: int, commit: int) -> None:
        """A leader's last heartbeat before it stops ticking `gid` (the follower may stop too)."""
        self.count += 1
        self.quiesce += (gid, term, commit)

    def payload(self) -> list[Any]:
        return [VERSION, self.heartbeats, self.heartbeat_resps, self.messages, self.quiesce]

    def __len__(self) -> int:
        return self.count


def decode_batch(payload: Any, sender: int, to: int) -> list[tuple[int, Message, bool]]:
    """`(gid, message, quiesce)` for every message of a payload from `sender` to `to`, in payload order
    (heartbeats, heartbeat answers, other messages, quiesce notices). A quiesce notice decodes to the
    HEARTBEAT it also is, with the flag set. Raises RaftWireError on anything malformed, including a
    message whose addresses are not (sender -> to)."""
    p = _seq(payload, "batch")
    if len(p) != 5 or p[0] != VERSION:
        raise RaftWireError(f"batch: expected [{VERSION}, heartbeats, responses, messages, quiesce]")
    hb, hbr, msgs, qs = (_seq(p[i], "batch section") for i in range(1, 5))
    if len(hb) % 3 or len(hbr) % 2 or len(msgs) % 2 or len(qs) % 3:
        raise RaftWireError("batch: section length")
    out: list[tuple[int, Message, bool]] = []
    for i in range(0, len(hb), 3):
        m = Message(_HB, to, sender, _int(hb[i + 1], "term"), commit=_int(hb[i + 2], "commit"))
        out.append((_gid(hb[i]), m, False))
    for i in range(0, len(hbr), 2):
        out.append((_gid(hbr[i]), Message(_HB_RESP, to, sender, _int(hbr[i + 1], "term")), False))
    for i in range(0, len(msgs), 2):
        m = decode_message(msgs[i + 1])
        if m.sender != sender or m.to != to:
            raise RaftWireError(f"message {m.sender}->{m.to} in a batch {sender}->{to}")
        out.append((_gid(msgs[i]), m, False))
    for i in range(0, len(qs), 3):
        m = Message(_HB, to, sender, _int(qs[i + 1], "term"), commit=_int(qs[i + 2], "commit"))
        out.append((_gid(qs[i]), m, True))
    return out


def _gid(v: Any) -> int:
    gid = _int(v, "group id")
    if gid == 0:
        raise RaftWireError("group id 0")
    return gid
