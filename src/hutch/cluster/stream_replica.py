"""The stream replica protocol: one member of one replicated stream, as a pure machine (osiris's
writer and replica, `osiris_writer.erl` / `osiris_replica.erl`, without their processes).

Owns `StreamMember`: the role a member plays in an epoch (writer, replica, or fenced and waiting), the
shipping of chunks from the writer to each replica, the replicas' acknowledgements, and the commit
point. It does no IO, reads no clock and never holds chunk bodies: the runtime passes every input in
(`observe`, `step`, `append`, `written`, `shipped`, `tick`) and carries out the effects it returns, in
order (`Send`, `Ship`, `Write`, `Truncate`, `Reset`, `Committed`, `Report`, `Reelect`, `Stable`,
`Begin`).

What goes through Raft and what does not (docs/streams.md, "Replication"): the stream's members, its
epoch, its writer and elections are the coordinator's (stream_coordinator.py, a machine in a Raft group:
small, rare changes that must be agreed); the chunks go from the writer's segment files straight to the
replicas' (one copy per replica, no Raft log in between, no second write on any disk).

The rules, and why they are safe:
- An epoch has one writer, named by the coordinator. The writer appends chunks stamped with its epoch
  and ships them as they are in its files (`Ship` reads them, written whether or not synced yet, so the
  replicas' syncs run beside the writer's, as osiris's replica readers do), from each
  replica's agreed point (stream_tail.agreed_next) onwards. A replica writes them in order, syncs and
  acknowledges the next offset it holds; the writer counts a chunk as **committed** once a majority of
  the members (itself included) hold it on disk. Publishes are confirmed, and readers see chunks, only
  up to the commit point.
- **Fencing.** Before the coordinator names a writer for epoch `e`, a majority of the members each
  *fence* at `e`: from then on they accept nothing from an epoch below `e`, and each reports its
  durable tail. The coordinator picks the greatest tail (stream_tail.tail_key: last chunk's epoch,
  then length). A committed chunk is on a majority that acknowledged it before being fenced, that
  majority meets the fenced one, and every log greater in that order holds the chunk too (a log whose
  last epoch is `e2` is a prefix of writer `e2`'s log, which held every chunk committed before `e2`).
- **A new writer commits by its own epoch only.** Chunks left from earlier epochs are not committed by
  counting copies (Raft's Figure 8: a log with a later epoch could still win an election without them).
  Raft's new leader appends an entry of its own term (a marker) and commits the older ones once it is
  on a majority; here any chunk of the writer's own epoch does that work once it is on a majority (the
  epoch's first publish), and so does the epoch's *recorded start* below. No marker chunk is written, so
  the writer takes no offset for its epoch's start.
- **The epoch's start is recorded, not written.** What a marker does for an election is to make every
  log that holds it rank at the writer's epoch: it ends exactly the log the writer began from. So the
  writer asks the coordinator (a Raft state machine) to record that log (`Begin(epoch, tail)`, its whole
  log when it was named), and the coordinator ranks a report whose log *is* that log (same end, same
  epochs: stream_tail.same_log) at the epoch (stream_coordinator.election_key), as if it held the
  marker. The older chunks are committed once the record is applied (`View.recorded`) and a majority
  of the members hold exactly that log or more of this writer's: the writer on disk (`synced`), a
  replica once it acknowledged it *after* the writer's Start (`Progress.confirmed`: by then it has cut
  whatever of another writer followed, durably, so its log is the start log and not a longer one that
  ranks lower). Why it is safe: such a member's log is a prefix of the writer's, so ranking it at the
  writer's epoch keeps the election order's argument (below) whole; a committed chunk is then on a
  majority whose logs rank at the epoch or above, that majority meets every later election's, and
  the winner ranks at least as high, so it holds the chunk. Raft's figure 8 with a recorded start is
  tested on its own (tests/unit/test_stream_replica.py for the election, tests/sim/test_stream_replication.py
  `test_figure_8_*` through the whole protocol: ranked by `tail_key` alone, a committed chunk is cut);
  the simulation's random runs have idle writers among their faults.
- **No marker when there is nothing to commit.** A new writer whose whole log is known committed (its
  commit point, learned from an earlier writer or its own, is at its log's end, and that log holds a
  chunk of epoch 1 or later), or whose log is empty at offset 0, writes no marker: it has no older chunk
  to carry, and its own chunks are committed by counting, as Raft's current-term entries are. So a fresh
  stream's first message is at offset 0 and a writer change on a caught-up log leaves no gap. Why it is
  safe: the log's last chunk is committed, so it was committed by a writer of its own epoch `L` (the
  writer that committed it through a later chunk of its own epoch would have that chunk on a majority,
  and this writer, elected after, would hold it); every log whose last epoch is above `L` then holds the
  whole log (Leader Completeness and Log Matching), and one whose last epoch is `L` and that is at least
  as long holds it too. Its start is recorded all the same (an empty log at 0 and a writer named at
  declaration aside, whose epoch is stable from the start): the epoch is *stable* (`Stable`: the
  members may change, and the coordinator drops older records) once a majority ranks at the epoch,
  through a chunk of it or the record.
- A member's fenced epoch must survive a restart: the runtime restores it from the coordinator's
  state (it is in the Raft log) before the member takes part again (`StreamMember(fenced=...)`).
- Sessions: a replica says `Hello` (its durable tail) to the epoch's writer, again every `hello_ticks`
  until it gets a `Start`; Hellos are numbered and the replica takes only the Start that answers its
  latest, after which it says no more Hellos in that epoch. The writer answers a Hello newer than the
  last it answered with a Start (the agreed point) and a fresh progress; acknowledgements carry the
  session and count only in it. So the writer never counts a chunk on a replica that truncated it.
- Lost, duplicated and reordered messages: a replica drops chunks it holds already, answers a gap with
  `Nack` (the writer ships again from there); the writer ships again from the last acknowledgement when
  a replica stays silent for `resend_ticks`; a replica answers a heartbeat whose commit point is below
  its synced end with an Ack (so a lost Ack costs a tick even when nothing is shipped).
- Bounds: at most `max_inflight` ships of at most `ship_bytes` each per replica are unacknowledged.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hutch.cluster.stream_tail import Tail, agreed_next, empty_at, must_reset, tail_from_wire, tail_to_wire


class ChunkRef(NamedTuple):
    """A chunk as the replica protocol sees it: its writer's epoch, its first offset, the offset after it,
    and its bytes as they are on disk (opaque here)."""

    epoch: int
    chunk_id: int
    next_offset: int
    data: bytes


# -- messages between members (each carries the epoch of the writer it belongs to) -------------------

class Hello(NamedTuple):
    """replica -> writer: I follow you in `epoch`; my log is `tail` (durable). `session` numbers the
    replica's Hellos, so that it takes only the Start that answers its latest one."""
    sender: str
    epoch: int
    session: int
    tail: Tail


class Start(NamedTuple):
    """writer -> replica: keep your log up to `from_offset` (or, `reset`, drop it and start empty there);
    chunks follow from that offset. `session`: the Hello it answers."""
    epoch: int
    session: int
    from_offset: int
    reset: bool
    commit: int


class Chunks(NamedTuple):
    """writer -> replica: consecutive chunks, and the writer's commit point."""
    epoch: int
    chunks: tuple[ChunkRef, ...]
    commit: int


class Ack(NamedTuple):
    """replica -> writer: my log holds everything before `next_offset` on disk (in the session that
    the writer's Start opened)."""
    sender: str
    epoch: int
    session: int
    next_offset: int


class Nack(NamedTuple):
    """replica -> writer: I missed chunks; ship again from `next_offset`."""
    sender: str
    epoch: int
    session: int
    next_offset: int


class Rehello(NamedTuple):
    """writer -> replica: your position fell below my first offset (retention removed what you still
    need): end session `session` and say Hello again (you will be reset)."""
    epoch: int
    session: int


class Commit(NamedTuple):
    """writer -> replica, on ticks: the commit point (the heartbeat)."""
    epoch: int
    commit: int


Message = Hello | Start | Chunks | Ack | Nack | Rehello | Commit


# -- the coordinator's view, as a member reads it (stream_coordinator.CoordState) ------------------------

class View(NamedTuple):
    """What the coordinator has decided: `epoch` with `writer` over `members` when `electing` is False;
    while `electing`, the epoch being elected (members fence at it and report their tails). `stable`:
    the coordinator knows the writer committed its own first chunk of the epoch."""
    epoch: int
    writer: str | None
    members: tuple[str, ...]
    electing: bool
    stable: bool = False
    recorded: bool = False  # the epoch's start is recorded (stream_coordinator.EpochStart)


# -- effects --------------------------------------------------------------------------------------------

class Send(NamedTuple):
    to: str
    message: Message


class Ship(NamedTuple):
    """Read chunks from the files from `start` (a chunk boundary) up to the end written, at most
    `max_bytes` (always at least one chunk), send them to `peer` as `Chunks`, then call `shipped`."""
    peer: str
    start: int
    max_bytes: int


class Write(NamedTuple):
    """Append these chunks to the local log (then sync and call `written`)."""
    chunks: tuple[ChunkRef, ...]


class Truncate(NamedTuple):
    """Cut the local log at `next_offset` (a chunk boundary); chunks past it are dropped."""
    next_offset: int


class Reset(NamedTuple):
    """Drop the whole local log; the next chunk written starts at `first`."""
    first: int


class Committed(NamedTuple):
    """Everything before `next_offset` is committed: confirm its publishes, wake its readers."""
    next_offset: int


class Reelect(NamedTuple):
    """To the coordinator: this member is named writer of `epoch` but is not writing it (it restarted,
    and its replicas' sessions died with it): elect again."""
    epoch: int


class Stable(NamedTuple):
    """To the coordinator: the writer's own first chunk of `epoch` is on a majority of the epoch's
    members, so they hold every committed chunk: the members may change again."""
    epoch: int


class Begin(NamedTuple):
    """To the coordinator: the writer of `epoch` began it over the log `tail` (record it: it stands for a
    marker chunk ending that log, module docstring)."""
    epoch: int
    tail: Tail


class Report(NamedTuple):
    """To the coordinator: fenced at `epoch`, durable log `tail` (an election's answer)."""
    sender: str
    epoch: int
    tail: Tail


Effect = Send | Ship | Write | Truncate | Reset | Committed | Report | Reelect | Stable | Begin


class Role(enum.Enum):
    IDLE = "idle"          # fenced or not yet told; accepts nothing
    WRITER = "writer"
    REPLICA = "replica"


@dataclass
class Progress:
    """The writer's view of one replica. Invariant: acked <= sent; every entry of `inflight` is in
    (acked, sent]."""
    started: bool = False
    session: int = 0                # the replica's Hello this progress answers
    acked: int = 0
    confirmed: int = -1             # the highest end the replica acknowledged with an Ack in this session
    sent: int = 0
    shipping: bool = False          # a Ship is out and `shipped` has not been called yet
    inflight: deque[int] = field(default_factory=deque)
    silent_ticks: int = 0
    rehello: bool = False           # a Rehello is out for `session`; repeated on ticks until a Hello


class StreamMember:
    """One member of one stream. `tail` is the durable log on start; `fenced` the epoch restored from
    the coordinator (nothing of a lower epoch is accepted); `commit` a commit point it knew before."""

    def __init__(self, name: str, tail: Tail, fenced: int = 0, *, fresh: bool = False, session_base: int = 0,
                 commit: int = 0,
                 ship_bytes: int = 256 << 10, max_inflight: int = 32, resend_ticks: int = 5,
                 hello_ticks: int = 10) -> None:
        tail.check()
        self.name = name
        self.log = tail          # what is appended (synced or not)
        self.synced = tail.next  # synced end. Invariant: log.first <= synced <= log.next
        # never an epoch older than one the log holds (a past view replayed must not be acted on)
        self.fenced = max(fenced, tail.last_epoch)
        # epochs up to this one may have been played by an earlier incarnation (none when `fresh`: the
        # member's files did not exist before, so it never wrote anything; a member whose files were lost
        # is not fresh but gone, and must be removed and added again, as a Raft server whose disk died)
        self.restored = -1 if fresh else self.fenced
        self.role = Role.IDLE
        self.epoch = 0           # the epoch of the role played (0: none)
        self.writer: str | None = None
        self.members: tuple[str, ...] = ()
        # a commit point this member knew before it restarted (the runtime's commit file; 0: none): true
        # still, and kept within the log it reopened
        self.commit = min(max(commit, 0), tail.next)
        # the writer: where its epoch began (`start`, over the log `start_tail`); whether older chunks it
        # holds are not known committed there (`carry`); whether it asks for its start to be recorded
        # and the coordinator has (`recorded`); `stable` once a majority ranks at its epoch
        self.start = 0
        self.start_tail = tail
        self.carry = False
        self.record = False
        self.recorded = False
        self.stable = False
        self.progress: dict[str, Progress] = {}
        self.started = False     # replica: the writer's Start arrived for this epoch
        # replica: the number of its latest Hello; `session_base` keeps them growing across restarts
        # (the runtime passes its incarnation << 32), since a writer ignores Hellos older than one it answered
        self.session = session_base
        self.since_hello = 0
        self.ship_bytes = ship_bytes
        self.max_inflight = max_inflight
        self.resend_ticks = resend_ticks
        self.hello_ticks = hello_ticks

    # -- the coordinator's decisions ------------------------------------------------------------------

    def observe(self, view: View) -> list[Effect]:
        """Take the coordinator's current view (idempotent: called whenever it may have changed)."""
        if view.electing:
            if view.epoch < self.fenced:
                return []
            self._fence(view.epoch)
            if self.name not in view.members:
                return []  # a removed member (a removed writer too) stops and answers nothing
            self.restored = -1
            return [Report(self.name, view.epoch, self.durable_tail())]
        if view.epoch == self.epoch and self.role is Role.WRITER:
            return self._writer_view(view)
        if view.epoch < self.fenced or view.epoch <= self.epoch and self.role is not Role.IDLE:
            return []
        if self.name not in view.members or view.writer is None:
            self._fence(view.epoch)
            return []
        if view.writer == self.name and view.epoch <= self.restored:
            return [Reelect(view.epoch)]  # named writer of an epoch a previous incarnation wrote
        self.fenced = view.epoch
        self.epoch, self.writer, self.members = view.epoch, view.writer, view.members
        if view.writer == self.name:
            return self._become_writer(view)
        self.role, self.started, self.since_hello = Role.REPLICA, False, 0
        self.commit = min(self.commit, self.synced)
        return [self._hello()]

    def _hello(self) -> Send:
        assert self.writer is not None
        self.session += 1
        return Send(self.writer, Hello(self.name, self.epoch, self.session, self.durable_tail()))

    def _fence(self, epoch: int) -> None:
        if epoch > self.fenced or self.role is not Role.IDLE:
            self.fenced = max(self.fenced, epoch)
            self.role, self.writer, self.progress = Role.IDLE, None, {}

    def _become_writer(self, view: View) -> list[Effect]:
        # What was appended and not yet synced stays: the writer's log may only grow past what it
        # reported (cutting it would drop chunks that, shipped in an earlier epoch of this same writer,
        # may be committed already: the simulation's seed 163 after shipping unsynced chunks)
        self.role = Role.WRITER
        self.progress = {m: Progress() for m in self.members if m != self.name}
        self.stable = False
        self.start, self.start_tail = self.log.next, self.log
        self.carry = self._carries()
        # a writer named at declaration over empty logs is stable from the start: nothing to record
        self.record = self.carry or not view.stable
        self.recorded = view.recorded
        self.stable = not self.record
        out: list[Effect] = [Begin(self.epoch, self.start_tail)] if self.record and not self.recorded else []
        # the runtime may not have been told the commit point yet (learned from a Start, or read back
        # after a restart): its readers see the log up to it now, not at the next publish
        if self.commit > 0:
            out.append(Committed(self.commit))
        return out + self._advance()

    def _writer_view(self, view: View) -> list[Effect]:
        """The writer sees its own epoch's view again: the record applied, or a proposal to repeat (one
        of its proposals may have been lost with a Raft leader)."""
        out: list[Effect] = []
        if view.recorded and not self.recorded:
            self.recorded = True
            out += self._advance()
        if self.record and not view.recorded:
            out.append(Begin(self.epoch, self.start_tail))
        elif self.stable and not view.stable and not any(isinstance(e, Stable) for e in out):
            out.append(Stable(self.epoch))
        return out

    @property
    def awaiting_record(self) -> bool:
        """The writer asked for its epoch's start to be recorded and has not seen it applied."""
        return self.role is Role.WRITER and self.record and not self.recorded

    def _carries(self) -> bool:
        """Whether the writer holds chunks not known committed, which only its epoch's first chunk or its
        recorded start may commit (module docstring: not when its log is empty at 0, or all of it is
        known committed and it holds a chunk of epoch 1 or later)."""
        if self.log == Tail(0, 0, ()):
            return False
        return not (self.commit >= self.log.next and self.log.last_epoch >= 1)

    # -- the writer -----------------------------------------------------------------------------------

    def append(self, records: int) -> tuple[int, int]:
        """Writer: reserve the next chunk of `records` records; returns (epoch, chunk_id). The runtime
        writes it with that epoch and id, syncs, and calls `written`."""
        assert self.role is Role.WRITER and records > 0
        chunk_id = self.log.next
        self.log = self.log.appended(self.epoch, chunk_id + records)
        assert self.start <= chunk_id
        return self.epoch, chunk_id

    def written(self, next_offset: int) -> list[Effect]:
        """The local log is synced up to `next_offset` (a chunk boundary)."""
        if next_offset <= self.synced or next_offset > self.log.next:
            return []   # a sync that finished after a truncation, or an old one
        self.synced = next_offset
        if self.role is Role.REPLICA and self.started and self.writer is not None:
            return [Send(self.writer, Ack(self.name, self.epoch, self.session, next_offset))]
        if self.role is Role.WRITER:
            return self._advance() + self._ship_all()
        return []

    def retained(self, first: int) -> None:
        """Retention removed the local segments before `first` (a chunk boundary at or below the
        commit point: only committed chunks are ever removed)."""
        assert first <= self.commit or first <= self.log.first, (first, self.commit)
        if first > self.log.first:
            self.log = self.log.trimmed(first)

    def shipments(self) -> list[Effect]:
        """Writer: the `Ship`s its appends since the last call make possible (the runtime asks once per
        loop turn, after the turn's appends)."""
        return self._ship_all() if self.role is Role.WRITER else []

    def shipped(self, peer: str, next_offset: int) -> list[Effect]:
        """The runtime sent `peer` the chunks up to `next_offset` (== the Ship's start: nothing to send)."""
        p = self.progress.get(peer)
        if self.role is not Role.WRITER or p is None or not p.shipping:
            return []
        p.shipping = False
        if next_offset > p.sent:
            p.sent = next_offset
            p.inflight.append(next_offset)
        return self._ship(peer, p)

    def _ship_all(self) -> list[Effect]:
        out: list[Effect] = []
        for peer, p in self.progress.items():
            out += self._ship(peer, p)
        return out

    def _ship(self, peer: str, p: Progress) -> list[Effect]:
        if p.started and p.sent < self.log.first:
            p.started, p.rehello, p.shipping = False, True, False
            return [Send(peer, Rehello(self.epoch, p.session))]
        if not p.started or p.shipping or p.sent >= self.log.next or len(p.inflight) >= self.max_inflight:
            return []
        p.shipping = True
        return [Ship(peer, p.sent, self.ship_bytes)]

    def _advance(self) -> list[Effect]:
        """Move the commit point to what a majority holds, once a majority ranks at the writer's epoch."""
        held = sorted([self.synced, *(p.acked if p.started else 0 for p in self.progress.values())],
                      reverse=True)
        majority = held[len(self.members) // 2]
        if not self._ranks(majority):
            return []
        out: list[Effect] = []
        if majority > self.commit:
            self.commit = majority
            out.append(Committed(majority))
        if not self.stable:
            self.stable = True
            out.append(Stable(self.epoch))
        return out

    def _ranks(self, majority: int) -> bool:
        """Whether a majority of the members rank at this writer's epoch in an election: they hold a chunk
        of it (`majority`, what a majority holds, is past the epoch's start), or the start is recorded
        and a majority hold exactly the start log or more (module docstring)."""
        if majority > self.start:
            return True
        if majority < self.start or not self.recorded:
            return False
        exact = (self.synced >= self.start) + sum(
            1 for p in self.progress.values() if p.started and p.confirmed >= self.start)
        return exact > len(self.members) // 2

    def _on_writer_message(self, m: Message) -> list[Effect]:
        if isinstance(m, Hello):
            p = self.progress.get(m.sender)
            if p is None:
                return []
            try:
                tail = m.tail.check()
            except ValueError:
                return []
            if m.session < p.session or m.session == p.session and p.started:
                return []  # a Hello answered already, or older than one answered (a late delivery)
            # against the whole log, synced or not: the commit point may be past the writer's own sync
            # (replicas acknowledged first), and a replica must never be cut below it (seed 605)
            agreed = agreed_next(self.log, tail)
            reset = must_reset(self.log, tail, agreed)
            start = self.log.first if reset else agreed
            self.progress[m.sender] = p = Progress(started=True, session=m.session, acked=start, sent=start)
            # the agreed point is on the replica's disk (its Hello's tail is durable): it counts for the
            # chunks up to it (not for the recorded start: the replica may hold more of another writer's
            # until its Ack says it cut them)
            return [Send(m.sender, Start(self.epoch, m.session, start, reset, self.commit)),
                    *self._ship(m.sender, p), *self._advance()]
        if not isinstance(m, Ack | Nack):
            return []
        p = self.progress.get(m.sender)
        if p is None or not p.started or m.session != p.session:
            return []  # not from the session the replica adopted
        p.silent_ticks = 0
        if isinstance(m, Ack):
            if m.next_offset > self.log.next:
                return []
            confirming = m.next_offset > p.confirmed
            p.confirmed = max(p.confirmed, m.next_offset)
            if m.next_offset <= p.acked:
                # the Ack after a Start says what the Hello said, but now after the replica's cut
                return self._advance() if confirming else []
            p.acked = m.next_offset
            p.sent = max(p.sent, p.acked)
            while p.inflight and p.inflight[0] <= p.acked:
                p.inflight.popleft()
            return self._advance() + self._ship(m.sender, p)
        assert isinstance(m, Nack)
        if p.acked <= m.next_offset < p.sent:
            p.sent = m.next_offset
            p.inflight.clear()
            return self._ship(m.sender, p)
        return []

    # -- the replica ----------------------------------------------------------------------------------

    def _on_replica_message(self, m: Message) -> list[Effect]:
        assert self.writer is not None
        if isinstance(m, Start):
            if self.started or m.session != self.session:
                return []  # not the answer to our latest Hello
            out: list[Effect] = []
            assert m.reset or m.from_offset >= self.commit, ("a committed chunk truncated", m, self.commit)
            if m.reset:
                self.log = empty_at(m.from_offset)
                self.synced = m.from_offset
                out.append(Reset(m.from_offset))
            elif m.from_offset != self.log.next:
                if not self.log.first <= m.from_offset <= self.synced:
                    return []  # not an answer to a Hello of this log (a stale Start): ask again
                self.log = self.log.clipped(m.from_offset)
                self.synced = m.from_offset
                out.append(Truncate(m.from_offset))
            self.started = True
            before = self.commit
            self.commit = min(max(self.commit, m.commit), self.synced)
            out.append(Send(self.writer, Ack(self.name, self.epoch, self.session, self.synced)))
            if self.commit > before:  # tell the runtime (its readers), as a heartbeat's commit would
                out.append(Committed(self.commit))
            return out
        if not self.started:
            return []
        if isinstance(m, Commit):
            out = self._learn_commit(m.commit)
            if m.commit < self.synced:
                # the writer has not committed what this replica holds: say again where it is (an Ack
                # lost while nothing is shipped, the Start's of an idle epoch, would leave it waiting)
                out.append(Send(self.writer, Ack(self.name, self.epoch, self.session, self.synced)))
            return out
        if isinstance(m, Rehello):
            if m.session != self.session:
                return []
            self.started, self.since_hello = False, 0
            return [self._hello()]
        assert isinstance(m, Chunks)
        fresh = [c for c in m.chunks if c.next_offset > self.log.next]
        if fresh and fresh[0].chunk_id != self.log.next:
            return [Send(self.writer, Nack(self.name, self.epoch, self.session, self.log.next))]
        for c in fresh:
            assert c.epoch <= self.epoch, (c, self.epoch)
            self.log = self.log.appended(c.epoch, c.next_offset)
        effects: list[Effect] = [Write(tuple(fresh))] if fresh else []
        if not fresh and m.chunks:  # a repeat: say where we are, so a writer that resent catches up
            effects.append(Send(self.writer, Ack(self.name, self.epoch, self.session, self.synced)))
        return effects + self._learn_commit(m.commit)

    def _learn_commit(self, commit: int) -> list[Effect]:
        c = min(commit, self.synced)
        if c <= self.commit:
            return []
        self.commit = c
        return [Committed(c)]

    # -- both -----------------------------------------------------------------------------------------

    def step(self, m: Message) -> list[Effect]:
        """A message from another member."""
        if m.epoch != self.epoch or self.role is Role.IDLE or m.epoch < self.fenced:
            return []
        if self.role is Role.WRITER:
            return self._on_writer_message(m)
        if isinstance(m, Start | Chunks | Commit | Rehello):
            return self._on_replica_message(m)
        return []

    def tick(self) -> list[Effect]:
        """One tick: the writer's heartbeat (commit point) and resends, a replica's repeated Hello."""
        out: list[Effect] = []
        if self.role is Role.WRITER:
            for peer, p in self.progress.items():
                out.append(Send(peer, Commit(self.epoch, self.commit)))
                if p.rehello:
                    out.append(Send(peer, Rehello(self.epoch, p.session)))
                if p.started and p.sent > p.acked:
                    p.silent_ticks += 1
                    if p.silent_ticks >= self.resend_ticks:
                        p.silent_ticks = 0
                        p.sent = p.acked
                        p.inflight.clear()
                        p.shipping = False
                        out += self._ship(peer, p)
                elif p.started:
                    out += self._ship(peer, p)
        elif self.role is Role.REPLICA and not self.started and self.writer is not None:
            self.since_hello += 1
            if self.since_hello >= self.hello_ticks:
                self.since_hello = 0
                out.append(self._hello())
        return out

    def durable_tail(self) -> Tail:
        return self.log.clipped(self.synced)

    def status(self) -> dict[str, object]:
        """For management and hutch-queues: role, epoch, offsets, and each replica's acknowledged end."""
        return {"role": self.role.value, "epoch": self.epoch, "writer": self.writer,
                "first": self.log.first, "next": self.log.next, "synced": self.synced,
                "commit": self.commit,
                "replicas": {p: pr.acked for p, pr in self.progress.items()}}


def chunk_ids(chunks: Sequence[ChunkRef]) -> list[int]:
    """The first offsets of `chunks` (for logs and tests)."""
    return [c.chunk_id for c in chunks]


# -- the wire: one msgpack-able positional list per message -----------------------------------------------

_KINDS: tuple[type, ...] = (Hello, Start, Chunks, Ack, Nack, Rehello, Commit)
_TAG = {kind: i for i, kind in enumerate(_KINDS)}


def message_to_wire(m: Message) -> list[object]:
    """`[tag, field, ...]`, a Tail as tail_to_wire's list and chunks as [[epoch, id, next, bytes], ...]."""
    if isinstance(m, Hello):
        return [_TAG[Hello], m.sender, m.epoch, m.session, tail_to_wire(m.tail)]
    if isinstance(m, Chunks):
        return [_TAG[Chunks], m.epoch, [list(c) for c in m.chunks], m.commit]
    return [_TAG[type(m)], *m]


def message_from_wire(value: Any) -> Message:  # Any: a msgpack value from a peer, checked here
    """The inverse of `message_to_wire`; ValueError for anything malformed (a peer's bad message is
    dropped, never half-applied)."""
    try:
        tag, *fields = value
        kind = _KINDS[int(tag)]
        if kind is Hello:
            sender, epoch, session, tail = fields
            return Hello(str(sender), int(epoch), int(session), tail_from_wire(tail))
        if kind is Chunks:
            epoch, chunks, commit = fields
            refs = tuple(ChunkRef(int(e), int(cid), int(nxt), bytes(data)) for e, cid, nxt, data in chunks)
            return Chunks(int(epoch), refs, int(commit))
        if kind is Start:
            epoch, session, from_offset, reset, commit = fields
            return Start(int(epoch), int(session), int(from_offset), bool(reset), int(commit))
        if kind in (Ack, Nack):
            sender, epoch, session, next_offset = fields
            return kind(str(sender), int(epoch), int(session), int(next_offset))
        converted = [int(f) for f in fields]
        return kind(*converted)
    except (TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"malformed stream replica message: {value!r:.80}") from exc
