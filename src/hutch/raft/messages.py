"""Raft value types: log entries, hard state, snapshots, configuration and messages.

This module owns every value that crosses a boundary of the Raft core: what the driver persists
(`Entry`, `HardState`, `Snapshot`), what it sends (`Message`) and what a configuration change looks
like (`ConfChange`, `ConfState`). All are immutable; the core never mutates a value after handing it
out, so the driver (and the simulator) may keep references without copying.

Rules:
- Index 0 / term 0 is the empty log. The first real entry has index 1.
- `NONE` (0) is "no node": node ids are positive integers.
- Every `Message` is a wire message. Local events (election or heartbeat timeout, snapshot status,
  unreachable peer) are method calls on `RawNode`, not messages, so the hot path allocates nothing for them.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field

NONE = 0
"""The "no node" id: no vote cast, no known leader."""


class EntryType(enum.IntEnum):
    NORMAL = 0
    CONF_CHANGE = 1


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. Invariant: (index, term) identifies the entry's data across all nodes."""

    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    def size_bytes(self) -> int:
        # A fixed 24-byte allowance per entry for framing, as the wire will carry index/term/type.
        return 24 + len(self.data)


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it is sent."""

    term: int = 0
    vote: int = NONE
    commit: int = 0


EMPTY_HARD_STATE = HardState()


@dataclass(frozen=True, slots=True)
class ConfState:
    """The voting members of a group. Invariant: `voters` is sorted and has no duplicates."""

    voters: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        voters = self.voters
        assert all(voters[i] < voters[i + 1] for i in range(len(voters) - 1)), f"voters unsorted: {voters}"

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.voters


class ConfChangeType(enum.IntEnum):
    ADD_NODE = 1
    REMOVE_NODE = 2


_CONF_CHANGE = struct.Struct(">BQ")


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A single-server membership change, carried in the data of a CONF_CHANGE entry."""

    type: ConfChangeType
    node_id: int

    def encode(self) -> bytes:
        return _CONF_CHANGE.pack(int(self.type), self.node_id)

    @staticmethod
    def decode(data: bytes) -> ConfChange:
        kind, node_id = _CONF_CHANGE.unpack(data)
        return ConfChange(ConfChangeType(kind), node_id)

    def apply_to(self, conf: ConfState) -> ConfState:
        """The configuration after this change; a change that changes nothing returns `conf`."""
        voters = set(conf.voters)
        if self.type is ConfChangeType.ADD_NODE:
            voters.add(self.node_id)
        else:
            voters.discard(self.node_id)
        if len(voters) == len(conf.voters):
            return conf
        return ConfState(tuple(sorted(voters)))


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int = 0
    term: int = 0
    conf_state: ConfState = field(default_factory=ConfState)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The application's state as of `meta.index`, with the configuration in force at that index."""

    meta: SnapshotMeta = field(default_factory=SnapshotMeta)
    data: bytes = b""

    @property
    def index(self) -> int:
        return self.meta.index

    @property
    def term(self) -> int:
        return self.meta.term

    def is_empty(self) -> bool:
        return self.meta.index == 0


EMPTY_SNAPSHOT = Snapshot()


class MessageType(enum.IntEnum):
    APP = 10  # AppendEntries: index/log_term = entry preceding `entries`; commit = leader commit
    APP_RESP = 11  # index = last index matched (or rejected index; reject_hint/log_term = hint)
    VOTE = 12  # RequestVote: index/log_term = candidate's last entry
    VOTE_RESP = 13
    PRE_VOTE = 14  # like VOTE for term+1, but nobody changes term or vote
    PRE_VOTE_RESP = 15
    SNAP = 16  # InstallSnapshot (whole snapshot in one message)
    HEARTBEAT = 17  # commit = min(leader commit, follower match): never commits past what it holds
    HEARTBEAT_RESP = 18
    TIMEOUT_NOW = 19  # leader transfer: campaign now, skipping pre-vote and the leader lease


class CampaignType(enum.IntEnum):
    PRE_ELECTION = 1
    ELECTION = 2
    TRANSFER = 3


@dataclass(frozen=True, slots=True)
class Message:
    """A Raft message. Fields a type does not use keep their defaults."""

    type: MessageType
    to: int = NONE
    sender: int = NONE
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    campaign: CampaignType | None = None  # VOTE/PRE_VOTE: TRANSFER bypasses the leader lease

    def size_bytes(self) -> int:
        total = 64
        for e in self.entries:
            total += e.size_bytes()
        if self.snapshot is not None:
            total += len(self.snapshot.data)
        return total
