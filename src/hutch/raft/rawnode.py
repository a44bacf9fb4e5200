"""`RawNode`: the driver-facing API of one Raft group member, and `Ready`, what the driver must do next.

This module owns the persistence contract. The driver loop, for each node, is:

    if node.has_ready():
        rd = node.ready()
        1. persist: storage.apply_snapshot(rd.snapshot) if any; storage.append(rd.entries);
                    storage.set_hard_state(rd.hard_state) if any; fsync if rd.must_sync
        2. send:    rd.messages (only now: they may promise what step 1 made durable: a vote,
                    an acknowledged entry)
        3. apply:   rd.snapshot, then rd.committed_entries, to the state machine, in order
        4. node.advance(rd)

Between `ready()` and `advance()` the driver may keep calling `tick`/`step`/`propose` (e.g. while the
fsync runs); their effects go into the next `Ready`. It must not call `ready()` again before
`advance()`: `has_ready()` answers False while a Ready is outstanding.

`has_ready()` allocates nothing, so polling thousands of idle groups is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .messages import CampaignType, ConfChange, ConfState, Entry, EntryType, HardState, Message, Snapshot
from .progress import Progress
from .raft import Config, Raft, StateType
from .storage import Storage


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state worth telling the driver about; never persisted."""

    lead: int
    state: StateType


@dataclass(slots=True)
class Ready:
    soft_state: SoftState | None = None  # changed leader or role, if any
    hard_state: HardState | None = None  # persist if not None
    entries: list[Entry] = field(default_factory=list)  # append to stable storage
    snapshot: Snapshot | None = None  # persist and apply (a leader's InstallSnapshot was accepted)
    committed_entries: list[Entry] = field(default_factory=list)  # apply, in order, after persisting
    messages: list[Message] = field(default_factory=list)  # send after persisting
    must_sync: bool = False  # entries, term or vote changed: fsync before sending


@dataclass(frozen=True, slots=True)
class Status:
    id: int
    term: int
    vote: int
    commit: int
    applied: int
    lead: int
    state: StateType
    voters: tuple[int, ...]
    progress: dict[int, Progress]


class RawNode:
    def __init__(self, config: Config, storage: Storage) -> None:
        self.raft = Raft(config, storage)
        self._prev_hs: HardState = self.raft.hard_state()
        self._prev_soft = SoftState(self.raft.lead, self.raft.state)
        self._outstanding = False

    # -- inputs --------------------------------------------------------------------------------

    def tick(self) -> None:
        self.raft.tick()

    def campaign(self) -> None:
        """Start an election now (pre-vote first if configured), e.g. to bootstrap a test."""
        self.raft.campaign(CampaignType.PRE_ELECTION if self.raft.cfg.pre_vote else CampaignType.ELECTION)

    def propose(self, data: bytes) -> int:
        """Append `data` as a new entry (leader only, else ProposalDroppedError); returns its index."""
        return self.raft.propose([(EntryType.NORMAL, data)])

    def propose_batch(self, datas: list[bytes]) -> int:
        """Append several entries in one step (one Ready, one fsync, one append per follower)."""
        return self.raft.propose([(EntryType.NORMAL, d) for d in datas])

    def propose_conf_change(self, cc: ConfChange) -> int:
        return self.raft.propose([(EntryType.CONF_CHANGE, cc.encode())])

    def step(self, m: Message) -> None:
        """Feed a message received from a peer (of this group)."""
        self.raft.step(m)

    def transfer_leader(self, target: int) -> None:
        self.raft.transfer_leader(target)

    def report_snapshot(self, to: int, ok: bool) -> None:
        self.raft.report_snapshot(to, ok)

    def report_unreachable(self, to: int) -> None:
        self.raft.report_unreachable(to)

    # -- outputs -------------------------------------------------------------------------------

    def has_ready(self) -> bool:
        if self._outstanding:
            return False
        r = self.raft
        log = r.log
        if r.msgs or log.unstable.entries or log.unstable.snapshot is not None:
            return True
        hs = self._prev_hs
        if r.term != hs.term or r.vote != hs.vote or log.committed != hs.commit:
            return True
        if r.lead != self._prev_soft.lead or r.state is not self._prev_soft.state:
            return True
        return log.has_next_committed_entries()

    def ready(self) -> Ready:
        if self._outstanding:
            raise RuntimeError("ready() called again before advance()")
        r = self.raft
        log = r.log
        rd = Ready()
        soft = SoftState(r.lead, r.state)
        if soft != self._prev_soft:
            rd.soft_state = soft
        hs = r.hard_state()
        if hs != self._prev_hs:
            rd.hard_state = hs
            rd.must_sync = hs.term != self._prev_hs.term or hs.vote != self._prev_hs.vote
        rd.entries = list(log.unstable.entries)
        if rd.entries:
            rd.must_sync = True
        rd.snapshot = log.unstable.snapshot
        if rd.snapshot is not None:
            rd.must_sync = True
        rd.committed_entries = log.next_committed_entries()
        if rd.committed_entries:
            log.applying = rd.committed_entries[-1].index
        rd.messages, r.msgs = r.msgs, []
        self._outstanding = True
        return rd

    def advance(self, rd: Ready) -> None:
        """Acknowledge that `rd` was persisted, sent and applied."""
        log = self.raft.log
        if rd.soft_state is not None:
            self._prev_soft = rd.soft_state
        if rd.hard_state is not None:
            self._prev_hs = rd.hard_state
        if rd.entries:
            last = rd.entries[-1]
            log.stable_to(last.index, last.term)
        if rd.snapshot is not None:
            log.stable_snap_to(rd.snapshot.index)
            log.applied_to(rd.snapshot.index)
        if rd.committed_entries:
            log.applied_to(rd.committed_entries[-1].index)
        self._outstanding = False

    # -- introspection -------------------------------------------------------------------------

    def status(self) -> Status:
        r = self.raft
        return Status(
            r.id,
            r.term,
            r.vote,
            r.log.committed,
            r.log.applied,
            r.lead,
            r.state,
            r.log.config.current.voters,
            dict(r.prs.progress) if r.state is StateType.LEADER else {},
        )

    def conf_state_at(self, index: int) -> ConfState:
        """The configuration in force at `index`, for index >= the latest snapshot the core has seen.

        Applications usually track it themselves instead (`ConfChange.apply_to` on each applied
        CONF_CHANGE entry, starting from the snapshot's conf state), which works for any applied index.
        """
        return self.raft.log.config.at(index)
