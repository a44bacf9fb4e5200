"""The leader's view of each follower: replication progress, flow control and quorum arithmetic.

This module owns:
- `Inflights`: the pipelining window of one follower (append messages sent and not yet acknowledged,
  bounded in count and bytes).
- `Progress`: match/next indexes and the replication state of one follower, as in etcd's
  tracker/progress.go: PROBE (one append at a time until we find where logs match), REPLICATE
  (optimistic pipelining within the inflight window), SNAPSHOT (a snapshot is on its way; no appends).
- `ProgressTracker`: progress of every voter, vote tallies and the quorum commit index.

Invariants: `match < next`; in REPLICATE, `inflights` holds the strictly increasing last indexes of the
appends sent and not yet acknowledged, all `< next`; only voters count towards quorums.
"""

from __future__ import annotations

import enum
from collections import deque


class ProgressState(enum.IntEnum):
    PROBE = 0
    REPLICATE = 1
    SNAPSHOT = 2


class VoteResult(enum.IntEnum):
    PENDING = 0
    WON = 1
    LOST = 2


class Inflights:
    """Last index and size of each in-flight append; full at `max_count` messages or `max_bytes`."""

    __slots__ = ("_q", "bytes", "max_bytes", "max_count")

    def __init__(self, max_count: int, max_bytes: int = 0) -> None:
        self._q: deque[tuple[int, int]] = deque()
        self.max_count = max_count
        self.max_bytes = max_bytes  # 0: no byte limit
        self.bytes = 0

    def add(self, last_index: int, size: int) -> None:
        self._q.append((last_index, size))
        self.bytes += size

    def free_le(self, index: int) -> None:
        q = self._q
        while q and q[0][0] <= index:
            self.bytes -= q.popleft()[1]

    def free_first_one(self) -> None:
        if self._q:
            self.bytes -= self._q.popleft()[1]

    def full(self) -> bool:
        return len(self._q) >= self.max_count or (self.max_bytes > 0 and self.bytes >= self.max_bytes)

    def reset(self) -> None:
        self._q.clear()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._q)


class Progress:
    __slots__ = (
        "inflights",
        "match",
        "next",
        "pending_snapshot",
        "probe_sent",
        "recent_active",
        "snapshot_ticks",
        "state",
    )

    def __init__(self, next_index: int, match: int, max_inflight: int, max_inflight_bytes: int) -> None:
        self.match = match
        self.next = next_index
        self.state = ProgressState.PROBE
        self.pending_snapshot = 0
        self.snapshot_ticks = 0
        # PROBE: an append was sent and we wait for its answer (or a heartbeat answer) before the next.
        self.probe_sent = False
        # Heard from since the last check-quorum; a new leader assumes everyone is active.
        self.recent_active = True
        self.inflights = Inflights(max_inflight, max_inflight_bytes)

    def _reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = 0
        self.snapshot_ticks = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self._reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self._reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self._reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self._reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def maybe_update(self, index: int) -> bool:
        """An acknowledgement up to `index`; False if it is stale."""
        updated = False
        if self.match < index:
            self.match = index
            updated = True
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        assert self.match < self.next
        return updated

    def optimistic_update(self, last_index: int) -> None:
        self.next = last_index + 1

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the append at `rejected`; False if stale. Backs `next` off to the hint."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # not the probe we are waiting for
        self.next = max(min(rejected, match_hint + 1), self.match + 1)
        assert self.match < self.next
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True

    def __repr__(self) -> str:
        return f"Progress({self.state.name} match={self.match} next={self.next} inflight={len(self.inflights)})"


class ProgressTracker:
    """Progress of the voters in the current configuration, and the votes of an election."""

    def __init__(self, max_inflight: int, max_inflight_bytes: int) -> None:
        self.voters: tuple[int, ...] = ()
        self.progress: dict[int, Progress] = {}
        self.votes: dict[int, bool] = {}
        self.max_inflight = max_inflight
        self.max_inflight_bytes = max_inflight_bytes

    def new_progress(self, next_index: int, match: int) -> Progress:
        return Progress(next_index, match, self.max_inflight, self.max_inflight_bytes)

    def set_voters(self, voters: tuple[int, ...], next_index: int) -> None:
        """Switch to a new configuration, keeping the progress of voters that stay."""
        self.voters = voters
        progress = {}
        for v in voters:
            pr = self.progress.get(v)
            progress[v] = pr if pr is not None else self.new_progress(next_index, 0)
        self.progress = progress

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def committed(self) -> int:
        """The largest index replicated on a majority of voters (0 with no voters)."""
        if not self.voters:
            return 0
        matches = sorted((self.progress[v].match for v in self.voters), reverse=True)
        return matches[self.quorum() - 1]

    def reset_votes(self) -> None:
        self.votes = {}

    def record_vote(self, node_id: int, granted: bool) -> None:
        self.votes.setdefault(node_id, granted)

    def tally_votes(self) -> VoteResult:
        granted = rejected = 0
        for v in self.voters:
            vote = self.votes.get(v)
            if vote is True:
                granted += 1
            elif vote is False:
                rejected += 1
        q = self.quorum()
        if granted >= q:
            return VoteResult.WON
        if len(self.voters) - rejected < q:
            return VoteResult.LOST
        return VoteResult.PENDING

    def quorum_active(self, self_id: int) -> bool:
        """Whether a majority (counting the leader if it is a voter) was heard from recently."""
        active = sum(1 for v in self.voters if v == self_id or self.progress[v].recent_active)
        return active >= self.quorum()
