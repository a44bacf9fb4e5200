"""The Raft state machine of one node of one group: roles, elections, replication, commit, snapshots.

This module owns `Raft`, the protocol logic behind `RawNode`, in the style of etcd-io/raft's raft.go.
It does no IO, reads no clock and starts no thread: time is `tick()`, randomness is the injected
`random.Random`, input is `step(message)` / `propose(...)`, and output is appended to `self.msgs` and to
the log's unstable part, which `RawNode.ready()` hands to the driver.

Rules kept here (paper section in brackets):
- Roles FOLLOWER, PRE_CANDIDATE (pre-vote, thesis §9.6), CANDIDATE, LEADER.
- A node votes at most once per term, for a candidate whose log is at least as up-to-date [§5.2, §5.4.1].
- A leader commits an index only when a majority of voters store it *and* it is from the leader's
  current term [§5.4.2, Figure 8]; earlier entries are committed indirectly.
- Check-quorum: a leader that has not heard from a majority within an election timeout steps down, and a
  node that heard from a leader within the timeout ignores (pre-)votes of higher terms (the leader lease,
  thesis §4.2.3 and §6.4) unless the candidate was asked to campaign by a leader transfer (TimeoutNow).
- Membership changes: one voter at a time, in force on append (see membership.py).
- Idle groups are cheap: a follower's `tick()` increments and compares one counter; nothing is allocated
  unless a timeout fires.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from .log import NO_LIMIT, RaftLog
from .messages import (
    NONE,
    CampaignType,
    ConfChange,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
)
from .progress import Progress, ProgressState, ProgressTracker, VoteResult
from .storage import CompactedError, Storage

MT = MessageType


class StateType(enum.IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3


class ProposalDroppedError(Exception):
    """The proposal was not appended: this node is not leader, or a transfer/conf change is pending."""

    def __init__(self, reason: str, leader: int = NONE) -> None:
        super().__init__(reason)
        self.leader = leader


@dataclass
class Config:
    """Limits and timing of one node. Ticks are abstract: the driver decides how long one is."""

    id: int
    election_tick: int = 10  # randomized election timeout is in [election_tick, 2 * election_tick)
    heartbeat_tick: int = 1
    max_size_per_msg: int = 1 << 20  # bytes of entries per append (at least one entry is always sent)
    max_entries_per_msg: int = 256
    max_inflight_msgs: int = 256  # pipelining window per follower
    max_inflight_bytes: int = 0  # 0: unbounded
    max_committed_size_per_ready: int = NO_LIMIT
    pre_vote: bool = True
    check_quorum: bool = True
    snapshot_retry_ticks: int = 0  # 0: 2 * election_tick; a snapshot not acknowledged by then is resent
    # On restart: the index the application's state machine already reflects (e.g. its snapshot's index,
    # which may be above the first index - 1 when the log was compacted less than it could be).
    applied: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def validate(self) -> None:
        if self.id <= 0:
            raise ValueError("node id must be positive")
        if self.heartbeat_tick <= 0 or self.election_tick <= self.heartbeat_tick:
            raise ValueError("need 0 < heartbeat_tick < election_tick")
        if self.max_inflight_msgs <= 0 or self.max_entries_per_msg <= 0:
            raise ValueError("max_inflight_msgs and max_entries_per_msg must be positive")


_VOTE_RESP = {MT.VOTE: MT.VOTE_RESP, MT.PRE_VOTE: MT.PRE_VOTE_RESP}


class Raft:
    def __init__(self, config: Config, storage: Storage) -> None:
        config.validate()
        self.id = config.id
        self.cfg = config
        self.rng = config.rng
        self.election_timeout = config.election_tick
        self.heartbeat_timeout = config.heartbeat_tick
        self.snapshot_retry_ticks = config.snapshot_retry_ticks or 2 * config.election_tick
        self.log = RaftLog(storage, config.max_committed_size_per_ready)
        self.prs = ProgressTracker(config.max_inflight_msgs, config.max_inflight_bytes)
        self.msgs: list[Message] = []
        self.term = 0
        self.vote = NONE
        self.state = StateType.FOLLOWER
        self.lead = NONE
        self.lead_transferee = NONE
        # Index of the latest conf change (or of the leader's first entry): no new conf change is
        # proposed until it is committed.
        self.pending_conf_index = 0
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = self.election_timeout
        hs, _ = storage.initial_state()
        if hs.term or hs.vote or hs.commit:
            self.term, self.vote = hs.term, hs.vote
            self.log.commit_to(hs.commit)
        if config.applied:
            self.log.applied_to(config.applied)
        self._conf = self.log.config.current
        self.prs.set_voters(self._conf.voters, self.log.last_index() + 1)
        self.become_follower(self.term, NONE)

    # -- state ---------------------------------------------------------------------------------

    def hard_state(self) -> HardState:
        return HardState(self.term, self.vote, self.log.committed)

    def promotable(self) -> bool:
        return self.id in self._conf.voters

    def _sync_config(self) -> None:
        """Follow the configuration of the log (it changes on append, truncation and restore)."""
        conf = self.log.config.current
        if conf is self._conf:
            return
        self._conf = conf
        self.prs.set_voters(conf.voters, self.log.last_index() + 1)
        if self.state is StateType.LEADER:
            if self.lead_transferee != NONE and self.lead_transferee not in conf.voters:
                self.lead_transferee = NONE
            own = self.prs.progress.get(self.id)
            if own is not None:
                own.maybe_update(self.log.last_index())

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = NONE
        self.lead = NONE
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_election_timeout = self.election_timeout + self.rng.randrange(self.election_timeout)
        self.lead_transferee = NONE
        self.prs.reset_votes()
        last = self.log.last_index()
        for node_id in self.prs.progress:
            pr = self.prs.new_progress(last + 1, last if node_id == self.id else 0)
            self.prs.progress[node_id] = pr

    def become_follower(self, term: int, lead: int) -> None:
        self._reset(term)
        self.lead = lead
        self.state = StateType.FOLLOWER

    def _become_pre_candidate(self) -> None:
        # Pre-vote changes neither term nor vote: a node that cannot win cannot disrupt (thesis §9.6).
        self.prs.reset_votes()
        self.lead = NONE
        self.state = StateType.PRE_CANDIDATE

    def _become_candidate(self) -> None:
        self._reset(self.term + 1)
        self.vote = self.id
        self.state = StateType.CANDIDATE

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.lead = self.id
        self.state = StateType.LEADER
        own = self.prs.progress.get(self.id)
        if own is not None:
            own.become_replicate()
        # The leader's first entry: commits everything before it (Figure 8), and no conf change is
        # accepted until it commits (the fix to the single-server change rule).
        self.pending_conf_index = self.log.last_index() + 1
        self._append_entries([Entry(self.term, self.log.last_index() + 1)])

    # -- time ----------------------------------------------------------------------------------

    def tick(self) -> None:
        if self.state is StateType.LEADER:
            self._tick_heartbeat()
            return
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_election_timeout and self.promotable():
            self.election_elapsed = 0
            self.campaign(CampaignType.PRE_ELECTION if self.cfg.pre_vote else CampaignType.ELECTION)

    def _tick_heartbeat(self) -> None:
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout:
            self.election_elapsed = 0
            if self.cfg.check_quorum:
                self._check_quorum()
                if self.state is not StateType.LEADER:
                    return
            # A transfer that did not finish within an election timeout is abandoned.
            self.lead_transferee = NONE
        if self.heartbeat_elapsed >= self.heartbeat_timeout:
            self.heartbeat_elapsed = 0
            self._bcast_heartbeat()

    def _check_quorum(self) -> None:
        if not self.prs.quorum_active(self.id):
            self.become_follower(self.term, NONE)
            return
        for node_id, pr in self.prs.progress.items():
            if node_id != self.id:
                pr.recent_active = False

    # -- elections -----------------------------------------------------------------------------

    def campaign(self, kind: CampaignType) -> None:
        """Start an election (or pre-election) now. No-op for a leader or a node not in the config."""
        if self.state is StateType.LEADER or not self.promotable():
            return
        if kind is CampaignType.PRE_ELECTION:
            self._become_pre_candidate()
            vote_type, term = MT.PRE_VOTE, self.term + 1
        else:
            self._become_candidate()
            vote_type, term = MT.VOTE, self.term
        self.prs.record_vote(self.id, True)
        if self.prs.tally_votes() is VoteResult.WON:
            if kind is CampaignType.PRE_ELECTION:
                self.campaign(CampaignType.ELECTION)
            else:
                self._become_leader()
            return
        last = self.log.last_index()
        last_term = self.log.last_term()
        flag = CampaignType.TRANSFER if kind is CampaignType.TRANSFER else None
        for v in self.prs.voters:
            if v != self.id:
                self.msgs.append(
                    Message(vote_type, to=v, sender=self.id, term=term, index=last, log_term=last_term, campaign=flag)
                )

    def _handle_vote(self, m: Message) -> None:
        can_vote = (
            self.vote == m.sender
            or (self.vote == NONE and self.lead == NONE)
            or (m.type is MT.PRE_VOTE and m.term > self.term)
        )
        resp = _VOTE_RESP[m.type]
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # Answer with the candidate's term: a pre-candidate must recognise its own pre-election.
            self.msgs.append(Message(resp, to=m.sender, sender=self.id, term=m.term))
            if m.type is MT.VOTE:
                self.election_elapsed = 0
                self.vote = m.sender
        else:
            self.msgs.append(Message(resp, to=m.sender, sender=self.id, term=self.term, reject=True))

    # -- input ---------------------------------------------------------------------------------

    def step(self, m: Message) -> None:
        if m.term > self.term:
            if m.type is MT.VOTE or m.type is MT.PRE_VOTE:
                in_lease = (
                    self.cfg.check_quorum and self.lead != NONE and self.election_elapsed < self.election_timeout
                )
                if in_lease and m.campaign is not CampaignType.TRANSFER:
                    return  # we heard from a leader recently: do not let this candidate disrupt it
            if m.type is MT.PRE_VOTE or (m.type is MT.PRE_VOTE_RESP and not m.reject):
                pass  # pre-votes never change terms; a granted pre-vote carries the future term
            elif m.type is MT.APP or m.type is MT.HEARTBEAT or m.type is MT.SNAP:
                self.become_follower(m.term, m.sender)
            else:
                self.become_follower(m.term, NONE)
        elif m.term < self.term:
            if (self.cfg.check_quorum or self.cfg.pre_vote) and (m.type is MT.HEARTBEAT or m.type is MT.APP):
                # A stale leader (e.g. after a partition): tell it our term so it steps down.
                self.msgs.append(Message(MT.APP_RESP, to=m.sender, sender=self.id, term=self.term))
            elif m.type is MT.PRE_VOTE:
                self.msgs.append(
                    Message(MT.PRE_VOTE_RESP, to=m.sender, sender=self.id, term=self.term, reject=True)
                )
            return

        if m.type is MT.VOTE or m.type is MT.PRE_VOTE:
            self._handle_vote(m)
        elif self.state is StateType.LEADER:
            self._step_leader(m)
        elif self.state is StateType.FOLLOWER:
            self._step_follower(m)
        else:
            self._step_candidate(m)

    def _step_follower(self, m: Message) -> None:
        if m.type is MT.APP:
            self.election_elapsed = 0
            self.lead = m.sender
            self._handle_append(m)
        elif m.type is MT.HEARTBEAT:
            self.election_elapsed = 0
            self.lead = m.sender
            self._handle_heartbeat(m)
        elif m.type is MT.SNAP:
            self.election_elapsed = 0
            self.lead = m.sender
            self._handle_snapshot(m)
        elif m.type is MT.TIMEOUT_NOW:
            # Leader transfer: campaign at once, without pre-vote, overriding the voters' lease.
            self.campaign(CampaignType.TRANSFER)

    def _step_candidate(self, m: Message) -> None:
        my_resp = MT.PRE_VOTE_RESP if self.state is StateType.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type is MT.APP:
            self.become_follower(m.term, m.sender)
            self._handle_append(m)
        elif m.type is MT.HEARTBEAT:
            self.become_follower(m.term, m.sender)
            self._handle_heartbeat(m)
        elif m.type is MT.SNAP:
            self.become_follower(m.term, m.sender)
            self._handle_snapshot(m)
        elif m.type is my_resp:
            self.prs.record_vote(m.sender, not m.reject)
            result = self.prs.tally_votes()
            if result is VoteResult.WON:
                if self.state is StateType.PRE_CANDIDATE:
                    self.campaign(CampaignType.ELECTION)
                else:
                    self._become_leader()
                    self._bcast_append()
            elif result is VoteResult.LOST:
                self.become_follower(self.term, NONE)

    # -- follower side of replication ----------------------------------------------------------

    def _handle_append(self, m: Message) -> None:
        log = self.log
        if m.index < log.committed:
            self.msgs.append(Message(MT.APP_RESP, to=m.sender, sender=self.id, term=self.term, index=log.committed))
            return
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        self._sync_config()
        if last_new is not None:
            self.msgs.append(Message(MT.APP_RESP, to=m.sender, sender=self.id, term=self.term, index=last_new))
            return
        # Reject with a hint so the leader skips a whole term per round trip (§5.3, end).
        hint_index, hint_term = log.find_conflict_by_term(min(m.index, log.last_index()), m.log_term)
        self.msgs.append(
            Message(
                MT.APP_RESP,
                to=m.sender,
                sender=self.id,
                term=self.term,
                index=m.index,
                reject=True,
                reject_hint=hint_index,
                log_term=hint_term,
            )
        )

    def _handle_heartbeat(self, m: Message) -> None:
        # m.commit <= what the leader knows we hold, so this never commits an entry we lack.
        self.log.commit_to(min(m.commit, self.log.last_index()))
        self.msgs.append(Message(MT.HEARTBEAT_RESP, to=m.sender, sender=self.id, term=self.term))

    def _handle_snapshot(self, m: Message) -> None:
        assert m.snapshot is not None
        index = self.log.last_index() if self._restore(m.snapshot) else self.log.committed
        self.msgs.append(Message(MT.APP_RESP, to=m.sender, sender=self.id, term=self.term, index=index))

    def _restore(self, snap: Snapshot) -> bool:
        log = self.log
        if snap.index <= log.committed:
            return False
        if log.match_term(snap.index, snap.term):
            log.commit_to(snap.index)  # we already hold the snapshot's last entry: fast-forward
            return False
        log.restore(snap)
        self._sync_config()
        return True

    # -- leader side of replication ------------------------------------------------------------

    def propose(self, entries: list[tuple[EntryType, bytes]]) -> int:
        """Append a batch of entries as leader; returns the index of the last one."""
        if self.state is not StateType.LEADER:
            raise ProposalDroppedError("not the leader", self.lead)
        if self.lead_transferee != NONE:
            raise ProposalDroppedError("leadership transfer in progress", self.lead)
        if self.id not in self._conf.voters:
            raise ProposalDroppedError("this leader is being removed from the group", NONE)
        first = self.log.last_index() + 1
        ents: list[Entry] = []
        for i, (kind, data) in enumerate(entries):
            if kind is EntryType.CONF_CHANGE:
                ConfChange.decode(data)  # refuse garbage before it is in the log
                if self.pending_conf_index > self.log.committed or any(
                    e.type is EntryType.CONF_CHANGE for e in ents
                ):
                    raise ProposalDroppedError("a configuration change is already in progress", self.id)
                self.pending_conf_index = first + i
            ents.append(Entry(self.term, first + i, kind, data))
        if not ents:
            return self.log.last_index()
        self._append_entries(ents)
        self._bcast_append()
        return ents[-1].index

    def _append_entries(self, ents: list[Entry]) -> None:
        last = self.log.append(ents)
        self._sync_config()
        own = self.prs.progress.get(self.id)
        if own is not None:
            own.maybe_update(last)
        self._maybe_commit()

    def _maybe_commit(self) -> bool:
        return self.log.maybe_commit(self.prs.committed(), self.term)

    def _maybe_step_down_removed(self) -> None:
        # Thesis §4.2.2: a leader not in C_new leads until C_new commits, then steps down.
        if (
            self.state is StateType.LEADER
            and self.id not in self._conf.voters
            and self.log.committed >= self.log.config.current_index
        ):
            self.become_follower(self.term, NONE)

    def _bcast_append(self) -> None:
        # Pipelining: in REPLICATE, keep sending batches until the inflight window is full.
        for v in self.prs.voters:
            if v != self.id and self._send_append(v):
                while self._send_append(v, send_if_empty=False):
                    pass

    def _bcast_heartbeat(self) -> None:
        committed = self.log.committed
        for v in self.prs.voters:
            if v == self.id:
                continue
            pr = self.prs.progress[v]
            if pr.state is ProgressState.SNAPSHOT:
                pr.snapshot_ticks += self.heartbeat_timeout
                if pr.snapshot_ticks >= self.snapshot_retry_ticks:
                    pr.become_probe()  # the snapshot or its answer was lost: find the match again
            self.msgs.append(
                Message(MT.HEARTBEAT, to=v, sender=self.id, term=self.term, commit=min(pr.match, committed))
            )

    def _send_append(self, to: int, send_if_empty: bool = True) -> bool:
        pr = self.prs.progress[to]
        if pr.is_paused():
            return False
        prev = pr.next - 1
        try:
            log_term = self.log.term(prev)
            ents = self.log.entries_from(pr.next, self.cfg.max_size_per_msg, self.cfg.max_entries_per_msg)
        except CompactedError:
            return self._send_snapshot(to, pr)
        if not ents and not send_if_empty:
            return False
        m = Message(
            MT.APP,
            to=to,
            sender=self.id,
            term=self.term,
            log_term=log_term,
            index=prev,
            entries=tuple(ents),
            commit=self.log.committed,
        )
        self.msgs.append(m)
        if pr.state is ProgressState.REPLICATE:
            if ents:
                last = ents[-1].index
                pr.optimistic_update(last)
                pr.inflights.add(last, m.size_bytes())
        else:
            pr.probe_sent = True
        return True

    def _send_snapshot(self, to: int, pr: Progress) -> bool:
        if not pr.recent_active:
            return False  # do not ship a snapshot to a node we have not heard from
        snap = self.log.snapshot()
        if snap.is_empty():
            return False
        self.msgs.append(Message(MT.SNAP, to=to, sender=self.id, term=self.term, snapshot=snap))
        pr.become_snapshot(snap.index)
        return True

    def _step_leader(self, m: Message) -> None:
        pr = self.prs.progress.get(m.sender)
        if pr is None:
            return
        if m.type is MT.APP_RESP:
            self._handle_append_response(m, pr)
        elif m.type is MT.HEARTBEAT_RESP:
            pr.recent_active = True
            pr.probe_sent = False
            if pr.state is ProgressState.REPLICATE and pr.inflights.full():
                # All in-flight appends may have been lost: make room to send one more.
                pr.inflights.free_first_one()
            if pr.match < self.log.last_index():
                self._send_append(m.sender)

    def _handle_append_response(self, m: Message, pr: Progress) -> None:
        pr.recent_active = True
        if m.reject:
            next_probe = m.reject_hint
            if m.log_term > 0:
                next_probe, _ = self.log.find_conflict_by_term(m.reject_hint, m.log_term)
            if pr.maybe_decr_to(m.index, next_probe):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.sender)
            return
        old_paused = pr.is_paused()
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        elif pr.state is ProgressState.REPLICATE:
            pr.inflights.free_le(m.index)
        if self._maybe_commit():
            self._bcast_append()  # carry the new commit index to everyone
        elif old_paused:
            self._send_append(m.sender)
        while self._send_append(m.sender, send_if_empty=False):
            pass
        if m.sender == self.lead_transferee and pr.match == self.log.last_index():
            self.msgs.append(Message(MT.TIMEOUT_NOW, to=m.sender, sender=self.id, term=self.term))
        self._maybe_step_down_removed()

    # -- operator actions ----------------------------------------------------------------------

    def transfer_leader(self, target: int) -> None:
        """Hand leadership to `target` once its log is up to date (thesis §3.10)."""
        if self.state is not StateType.LEADER or target == self.id or target not in self.prs.progress:
            return
        if self.lead_transferee == target:
            return
        self.election_elapsed = 0  # the transfer must finish within one election timeout
        self.lead_transferee = target
        pr = self.prs.progress[target]
        if pr.match == self.log.last_index():
            self.msgs.append(Message(MT.TIMEOUT_NOW, to=target, sender=self.id, term=self.term))
        else:
            self._send_append(target)

    def report_snapshot(self, to: int, ok: bool) -> None:
        pr = self.prs.progress.get(to)
        if self.state is not StateType.LEADER or pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        pr.probe_sent = True  # wait for a heartbeat answer before probing

    def report_unreachable(self, to: int) -> None:
        pr = self.prs.progress.get(to)
        if self.state is StateType.LEADER and pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()
