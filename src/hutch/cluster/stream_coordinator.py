"""The stream coordinator: one replicated stream's members, epoch and writer, as a pure machine whose
commands go through a Raft group (RabbitMQ's `rabbit_stream_coordinator`, a Ra machine, for one stream).

Owns `CoordState` and `apply(state, command) -> CoordState`: the few decisions that must be agreed —
who the members are, which epoch is current, who writes it, and the elections that pick a new writer.
Chunks never go through it (stream_replica.py ships them); it sees one command per failure or membership
change, so its Raft log stays tiny whatever the stream's traffic.

Rules:
- Epoch 1's writer is chosen at declaration (every log is empty, nothing needs fencing).
- `WriterDown(epoch)` (the writer's node is gone, or the writer restarted) starts the election of epoch+1:
  every member fences at it and answers `TailReport`; once a majority of the members have, the greatest
  tail (stream_tail.tail_key, ties to the earliest member in the member list) writes the new epoch.
  Reports for another epoch, or from non-members, are ignored; a report after the choice changes nothing.
- `ChangeMembers(members)` adds or removes exactly one member, only while a writer is in place and
  *stable* (`EpochStable`: its own first chunk of the epoch is on a majority of the epoch's members,
  which therefore hold every committed chunk): single-server changes, so the majorities before and
  after overlap (Raft thesis §4.1), and never two before the first has taken hold (two would let a
  majority of the newest set miss what a majority of the oldest holds: the simulation found this,
  seed 2 of tests/sim/test_stream_replication.py). A new epoch starts: the same writer if it stays a
  member (its log holds every committed chunk), an election among the new members otherwise.
- `EpochStart(epoch, tail)`: the writer of the current epoch began it over the log `tail` (its whole
  log when it was named). Recorded once per epoch, it stands for a marker chunk that would end that log
  (stream_replica.py, "The epoch's start is recorded, not written"): in an election a report whose log
  *is* a recorded start (stream_tail.same_log) ranks with that start's epoch (`election_key`), as if it
  held the writer's marker. Records of epochs before the current one go once the current one is stable
  (a majority then ranks at its epoch or above, so the older records decide no election any more); the
  records kept are bounded by the elections since the last stable epoch.
- Invariant: `epoch` only grows; `writer` is a member or None (electing); `members` is never empty and
  has no duplicates; `starts` is ordered by epoch, one per epoch, none above `epoch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import msgpack

from hutch.cluster.stream_replica import Begin, Reelect, Report, Stable, View
from hutch.cluster.stream_tail import Tail, same_log, tail_from_wire, tail_key, tail_to_wire


class Declare(NamedTuple):
    members: tuple[str, ...]
    writer: str


class WriterDown(NamedTuple):
    epoch: int


class TailReport(NamedTuple):
    member: str
    epoch: int
    tail: Tail


class ChangeMembers(NamedTuple):
    members: tuple[str, ...]


class EpochStable(NamedTuple):
    """The writer of `epoch` committed its own first chunk (stream_replica.Stable)."""
    epoch: int


class EpochStart(NamedTuple):
    """The writer of `epoch` began it over the log `tail` (stream_replica.Begin)."""
    epoch: int
    tail: Tail


class Barrier(NamedTuple):
    """Changes nothing: a node that sees its own `token` applied knows its copy of the coordinator holds
    every decision committed before it (the read barrier a member waits for before it starts)."""
    token: int


Command = Declare | WriterDown | TailReport | ChangeMembers | EpochStable | Barrier | EpochStart


class CoordinatorError(ValueError):
    """A command the coordinator refuses (the same on every replica of it)."""


class CoordState(NamedTuple):
    epoch: int
    writer: str | None                   # None while electing `epoch`
    members: tuple[str, ...]
    reports: tuple[tuple[str, Tail], ...]  # the election's answers so far (electing only)
    stable: bool = False                 # the epoch's writer committed its own first chunk
    starts: tuple[tuple[int, Tail], ...] = ()  # recorded epoch starts (EpochStart), by epoch

    @property
    def electing(self) -> bool:
        return self.writer is None

    @property
    def recorded(self) -> bool:
        """The current epoch's start is recorded."""
        return bool(self.starts) and self.starts[-1][0] == self.epoch and not self.electing

    def view(self) -> View:
        """What a member acts on (stream_replica.StreamMember.observe)."""
        return View(self.epoch, self.writer, self.members, self.electing, self.stable, self.recorded)


NONE = CoordState(0, None, (), ())


def command_for(effect: Report | Reelect | Stable | Begin) -> Command:
    """The coordinator command a member's effect asks for (stream_replica's `Report`, `Reelect`, `Stable`,
    `Begin`)."""
    if isinstance(effect, Report):
        return TailReport(effect.sender, effect.epoch, effect.tail)
    if isinstance(effect, Reelect):
        return WriterDown(effect.epoch)
    if isinstance(effect, Begin):
        return EpochStart(effect.epoch, effect.tail)
    return EpochStable(effect.epoch)


def election_key(tail: Tail, starts: tuple[tuple[int, Tail], ...]) -> tuple[int, int]:
    """A report's rank in an election: `tail_key`, with the log's epoch raised to that of the latest
    recorded epoch start the log is exactly (it holds what that epoch's writer began from, as a member
    holding the writer's marker would)."""
    epoch, length = tail_key(tail)
    for start_epoch, start in reversed(starts):
        if start_epoch <= epoch:
            break
        if same_log(tail, start):
            return start_epoch, length
    return epoch, length


def _check_members(members: tuple[str, ...]) -> None:
    if not members or len(set(members)) != len(members):
        raise CoordinatorError(f"a stream's members must be distinct and at least one: {members!r}")


def apply(state: CoordState, cmd: Command) -> CoordState:
    """The coordinator's transition; raises CoordinatorError for a command it refuses."""
    if isinstance(cmd, Declare):
        _check_members(cmd.members)
        if state.epoch:
            raise CoordinatorError("the stream is declared already")
        if cmd.writer not in cmd.members:
            raise CoordinatorError(f"writer {cmd.writer!r} is not a member")
        return CoordState(1, cmd.writer, cmd.members, (), stable=True)  # empty logs: nothing to carry
    if isinstance(cmd, WriterDown):
        if cmd.epoch != state.epoch or state.electing:
            return state  # an old epoch's writer, or already electing
        return state._replace(epoch=state.epoch + 1, writer=None, reports=(), stable=False)
    if isinstance(cmd, TailReport):
        if not state.electing or cmd.epoch != state.epoch or cmd.member not in state.members:
            return state
        reports = dict(state.reports)
        reports.setdefault(cmd.member, cmd.tail)
        if len(reports) <= len(state.members) // 2:
            return state._replace(reports=tuple(reports.items()))
        order = {m: i for i, m in enumerate(state.members)}
        best = max(reports, key=lambda m: (election_key(reports[m], state.starts), -order[m]))
        return state._replace(writer=best, reports=())
    if isinstance(cmd, EpochStable):
        if cmd.epoch != state.epoch or state.electing:
            return state
        return state._replace(stable=True, starts=tuple(s for s in state.starts if s[0] >= cmd.epoch))
    if isinstance(cmd, EpochStart):
        if cmd.epoch != state.epoch or state.electing or state.recorded:
            return state  # another epoch's, or recorded already (the first wins: one writer per epoch)
        return state._replace(starts=(*state.starts, (cmd.epoch, cmd.tail)))
    if isinstance(cmd, Barrier):
        return state
    assert isinstance(cmd, ChangeMembers)
    _check_members(cmd.members)
    if state.electing or not state.stable:
        raise CoordinatorError("the stream's writer is not settled in its epoch yet (an election or a "
                               "member change is under way); try again shortly")
    if len(set(cmd.members) ^ set(state.members)) != 1:
        raise CoordinatorError("members change one at a time: add or remove exactly one member")
    writer = state.writer if state.writer in cmd.members else None
    return state._replace(epoch=state.epoch + 1, writer=writer, members=cmd.members, reports=(), stable=False)


# -- in the Raft log: commands as entries, the state as a snapshot ------------------------------------------

VERSION = 1
_KINDS: tuple[type, ...] = (Declare, WriterDown, TailReport, ChangeMembers, EpochStable, Barrier, EpochStart)
_TAG = {kind: i for i, kind in enumerate(_KINDS)}


def encode_command(cmd: Command) -> bytes:
    """A command as a Raft entry: msgpack `[version, tag, field, ...]`."""
    if isinstance(cmd, TailReport):
        fields: list[Any] = [cmd.member, cmd.epoch, tail_to_wire(cmd.tail)]
    elif isinstance(cmd, Declare):
        fields = [list(cmd.members), cmd.writer]
    elif isinstance(cmd, ChangeMembers):
        fields = [list(cmd.members)]
    elif isinstance(cmd, Barrier):
        fields = [cmd.token]
    elif isinstance(cmd, EpochStart):
        fields = [cmd.epoch, tail_to_wire(cmd.tail)]
    else:
        fields = [cmd.epoch]
    return msgpack.packb([VERSION, _TAG[type(cmd)], *fields])


def decode_command(data: bytes | memoryview) -> Command:
    """The inverse of `encode_command`; CoordinatorError for an entry it cannot read (the same on every
    replica, so every replica refuses it alike)."""
    try:
        version, tag, *fields = msgpack.unpackb(data)
        if version != VERSION:
            raise CoordinatorError(f"stream coordinator entry version {version} is not {VERSION}")
        kind = _KINDS[tag]
        if kind is TailReport:
            member, epoch, tail = fields
            return TailReport(str(member), int(epoch), tail_from_wire(tail))
        if kind is Declare:
            members, writer = fields
            return Declare(tuple(str(m) for m in members), str(writer))
        if kind is ChangeMembers:
            (members,) = fields
            return ChangeMembers(tuple(str(m) for m in members))
        if kind is EpochStart:
            epoch, tail = fields
            return EpochStart(int(epoch), tail_from_wire(tail))
        (number,) = fields
        if kind is Barrier:
            return Barrier(int(number))
        return WriterDown(int(number)) if kind is WriterDown else EpochStable(int(number))
    except (TypeError, ValueError, IndexError, msgpack.ExtraData) as exc:
        if isinstance(exc, CoordinatorError):
            raise
        raise CoordinatorError(f"malformed stream coordinator entry: {exc}") from exc


def snapshot_state(state: CoordState) -> bytes:
    return msgpack.packb([VERSION, state.epoch, state.writer, list(state.members),
                          [[m, tail_to_wire(t)] for m, t in state.reports], state.stable,
                          [[e, tail_to_wire(t)] for e, t in state.starts]])


def restore_state(data: bytes) -> CoordState:
    """The inverse of `snapshot_state`; a snapshot written before epoch starts were recorded (six fields)
    restores with none."""
    version, epoch, writer, members, reports, stable, *rest = msgpack.unpackb(data)
    if version != VERSION:
        raise CoordinatorError(f"stream coordinator snapshot version {version} is not {VERSION}")
    starts = tuple((int(e), tail_from_wire(t)) for e, t in rest[0]) if rest else ()
    return CoordState(int(epoch), writer, tuple(members),
                      tuple((str(m), tail_from_wire(t)) for m, t in reports), bool(stable), starts)


class CoordinatorMachine:
    """The coordinator as a Raft state machine (runtime/clustering/raft_group.py's `StateMachine`): applies
    entries in log order and tells `on_change` every new state (each replica of the group, so each member's
    node learns the view from its own copy)."""

    def __init__(self, on_change: Callable[[CoordState], None]) -> None:
        self.state = NONE
        self.on_change = on_change
        self.barriers_seen: set[int] = set()  # tokens of `Barrier`s applied here (cleared by their waiter)

    def apply(self, index: int, data: bytes) -> CoordState:
        before = self.state
        cmd = decode_command(data)
        if isinstance(cmd, Barrier):
            self.barriers_seen.add(cmd.token)
        self.state = apply(self.state, cmd)  # a CoordinatorError fails the proposer
        if self.state != before:
            self.on_change(self.state)
        return self.state

    def snapshot(self) -> bytes:
        return snapshot_state(self.state)

    def restore(self, data: bytes) -> None:
        self.state = restore_state(data)
        self.on_change(self.state)

    def on_membership(self, voters: tuple[int, ...]) -> None:
        """The Raft group's voters are the nodes hosting members; the coordinator's members are its own."""
