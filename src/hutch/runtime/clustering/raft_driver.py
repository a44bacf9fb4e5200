"""The Raft driver: runs every Raft group of a node (`hutch.raft.RawNode`) over one `RaftLogStore`.

Owns, for one node: the groups it hosts (`Group`, raft_group.py: a RawNode, its state machine, its
proposers), the store (`<data_dir>`: one WAL for all groups, storage/raft_log.py), the one tick timer,
the cycle that persists, syncs, sends and applies, coalescing of everything bound for a peer into one
payload (cluster/raft_wire.py), quiescence of idle groups, and taking snapshots of state machines.

Rules (docs/raft.md, "The driver"):
- One cycle for all groups with work, scheduled with `call_soon` when anything changes (a message, a
  proposal, a tick); never a task per message. A cycle: propose the batched proposals of each group
  (`propose_batch`), take the `Ready` of every group that has one, write every group's snapshot, entries
  and hard state to the one store, then:
  - Readies that need no fsync (heartbeats, commit-only changes) are finished at once: send, apply,
    advance.
  - The others wait for ONE `begin_sync()` job for all of them, run in the default executor; the cycle
    after it completes finishes them. At most one job is in flight; what arrives meanwhile is written
    and waits for the next job (pipelining). While the loop has time and the disk syncs fast
    (runtime/sync_placement.py), the job runs on the loop instead, in a cycle put last in its loop
    turn, and that cycle finishes the Readies at once. A Ready's messages never leave before its own records
    are durable, and a group has at most one Ready outstanding, so no later message depends on
    unsynced state either.
- `send(peer, payload)` is called only at the end of a cycle, at most once per peer, with every
  message for that peer from every group (heartbeats as `(gid, term, commit)` triples).
- Ticks: one `call_later` timer for the whole driver, armed only while some group ticks. A leader whose
  group is idle (nothing unapplied, every follower not reported down has match == last index ==
  commit) stops ticking and sends each follower a quiesce notice (a heartbeat with a flag); a follower
  that is caught up with that leader stops ticking too. Idle groups thus cost nothing. A proposal,
  campaign or transfer wakes a group, and so does a message, except answers that leave a quiesced
  leader with nothing to do and messages of its leader that leave a quiesced follower caught up;
  `peer_down(x)` wakes the followers whose leader is x (so they can elect), `peer_up(x)` the leaders of
  groups x belongs to (so they catch it up).
- Snapshots: every `snapshot_every` applied entries (or the machine's `snapshot_interval()`, if it
  has one: a quorum queue's entries carry batches of messages, so it counts messages, not entries) the
  machine's snapshot goes to the store (`create_snapshot`, synced when written) and the log is compacted
  to half an interval below it (slightly lagging followers still catch up from the log), never past a
  machine's `release_cursor()` (the first index
  it still needs, e.g. a quorum queue's oldest live message). A lagging follower gets the store's
  latest snapshot from the core; the receiver installs it (`apply_snapshot`) and `restore`s its machine.
- Proposals resolve on THIS node when their entry is applied: with `apply`'s return value; with
  `ProposalLost` (a `NotLeader`) when another term's entry was applied at or before its index (it was
  overwritten); `ProposalTimeout` when not applied in time (or covered by a snapshot: outcome unknown).
  Empty proposals are refused: an empty NORMAL entry is a new leader's no-op and is not applied.
- `store.flush()` (WAL -> segment files, when the WAL passes `wal_max_size_bytes`) runs inline between
  sync jobs: it mutates state the loop thread reads.
- Loop thread only, except `RaftSyncJob.run`.
- With the node's `LoopLoad` (`load`), every cycle's duration is counted as loop work: on a quorum
  queue's leader most of the work (appends, applies, deliveries) is done here, and the credit-flow rule
  judges the loop saturated from it (core/credit_flow.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from hutch.cluster.raft_wire import PeerBatch, RaftWireError, decode_batch
from hutch.core.credit_flow import LoopLoad
from hutch.raft import (
    Config,
    HardState,
    Message,
    MessageType,
    RawNode,
    Ready,
    StateType,
    bootstrap_entries,
)
from hutch.runtime.clustering.raft_group import (
    Group,
    GroupClosed,
    NotLeader,
    ProposalLost,
    ProposalTimeout,
    StateMachine,
)
from hutch.runtime.sync_placement import SyncPlacement
from hutch.storage.fs import FileSystem, RealFS
from hutch.storage.raft_log import DiskStorage, RaftLogOptions, RaftLogStore, RaftSyncJob

__all__ = ["Group", "GroupClosed", "NotLeader", "ProposalLost", "ProposalTimeout", "RaftDriver", "StateMachine"]

log = logging.getLogger("hutch.raft")

_LEADER = StateType.LEADER
_FOLLOWER = StateType.FOLLOWER
_HB_RESP = MessageType.HEARTBEAT_RESP
_APP_RESP = MessageType.APP_RESP


Unsynced = tuple[Group, Ready, int]  # a Ready written to the WAL up to seq, not yet synced


class RaftDriver:
    """Every Raft group of one node. `start()`, then `open_group(...)`; feed it `receive`/`peer_down`/`peer_up`."""

    def __init__(self, raft_id: int, data_dir: str, send: Callable[[int, Any], None], *,
                 tick_s: float = 0.1, election_tick: int = 10, heartbeat_tick: int = 1,
                 snapshot_every: int = 8192, log_options: RaftLogOptions | None = None,
                 fs: FileSystem | None = None, quiesce: bool = True, load: LoopLoad | None = None) -> None:
        if raft_id <= 0:
            raise ValueError("raft ids are positive")
        self.raft_id = raft_id
        self.data_dir = data_dir
        self.tick_s = tick_s
        self.election_tick = election_tick
        self.heartbeat_tick = heartbeat_tick
        self.snapshot_every = snapshot_every
        self.quiesce = quiesce  # False: leaders heartbeat every heartbeat_tick forever (tests, comparisons)
        self._send = send
        self.load = load  # the node's loop load (core/credit_flow.py): every cycle's duration counts in it
        # where the WAL syncs run (runtime/sync_placement.py): on the loop while it has time, the disk fast
        self.placement = SyncPlacement()
        if load is not None:
            self.placement.follow_loop(load, count_busy=False)  # the cycle, syncs included, is timed already
        self._deferred = False  # a sync due on the loop was put back once to the end of the loop's turn
        self._log_options = log_options
        self._fs: FileSystem = fs if fs is not None else RealFS()
        # set by start(), before any other method runs (the groups' GroupHost port reads _loop as set)
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set by start()
        self._store: RaftLogStore = None  # type: ignore[assignment]  # set by start()
        self._running = False
        self.failed: BaseException | None = None
        self._groups: dict[int, Group] = {}
        self._on_disk: set[int] = set()
        self._ticking: dict[int, Group] = {}  # Invariant: exactly the open groups that are not quiesced
        self._dirty: dict[int, Group] = {}  # may have a Ready: looked at by the next cycle
        self._proposing: dict[int, Group] = {}  # have proposals to hand to the core in the next cycle
        self._outbox: dict[int, PeerBatch] = {}
        self._unsynced: list[Unsynced] = []
        self._job: RaftSyncJob | None = None
        self._job_future: asyncio.Future[None] | None = None
        self._job_done = False
        self._force_sync = False  # records written outside a Ready (a bootstrap) must be synced
        self._scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._down: set[int] = set()
        # Counters (metrics, tests, the benchmark).
        self.cycles = 0
        self.fsyncs = 0  # group commits (sync jobs, and store flushes) completed
        self.synced_readies = 0  # Readies made durable by those syncs
        self.last_sync_readies = 0
        self.flushes = 0
        self.tick_rounds = 0  # timer firings with at least one ticking group
        self.ticks = 0  # RawNode.tick calls
        self.steps = 0  # messages stepped
        self.sends = 0  # send() calls (payloads)
        self.messages_sent = 0
        self.dropped = 0  # messages for groups not open here, or undecodable payloads
        self.proposals = 0  # entries proposed (NORMAL)
        self.commits = 0  # NORMAL entries applied (no-ops excluded)
        self.snapshots_taken = 0
        self.snapshots_restored = 0

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._store = await self._loop.run_in_executor(None, RaftLogStore.open, self._fs, self.data_dir,
                                                       self._log_options)
        report = self._store.wal.log.recovery  # what recovery repaired (docs/storage.md: log it at start)
        if report.torn_tail is not None:
            tail = report.torn_tail
            log.warning("raft log %s: a torn write at its end was dropped at recovery (%d bytes from offset %d: "
                        "%s); it was never synced, so nothing confirmed was in it", report.torn_segment,
                        tail.dropped_bytes, tail.offset, tail.reason)
        if report.ignored_files:
            log.warning("raft log: unexpected files left alone in the WAL directory: %s",
                        ", ".join(report.ignored_files))
        self._on_disk = {gid for gid in self._store.groups() if _has_state(self._store.group(gid))}
        self._running = True

    async def stop(self, *, crash: bool = False) -> None:
        """Stop: the in-flight sync (if any) is waited for, then, unless `crash`, everything written is
        synced. Nothing is sent or applied any more; waiting proposals fail with GroupClosed."""
        if self._store is None:
            return
        was_running, self._running = self._running, False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._job_future is not None:
            await asyncio.wait([self._job_future])
        if self._job is not None:
            job, self._job = self._job, None
            try:
                job.complete()
            except Exception:
                log.exception("raft driver %d: the last sync failed", self.raft_id)
        if not crash and was_running and self.failed is None:
            try:
                self._store.sync()
            except Exception:
                log.exception("raft driver %d: the final sync failed", self.raft_id)
        self._store.close()
        for g in list(self._groups.values()):
            g._fail_waiters(GroupClosed(f"raft driver {self.raft_id} stopped"))
            g._closed = True
        self._groups.clear()
        self._ticking.clear()
        self._dirty.clear()
        self._proposing.clear()
        self._unsynced.clear()
        self._outbox.clear()

    def groups_on_disk(self) -> list[int]:
        return sorted(self._on_disk)

    @property
    def groups(self) -> dict[int, Group]:
        return self._groups

    def open_group(self, gid: int, machine: StateMachine, *,
                   bootstrap_voters: Sequence[int] | None = None) -> Group:
        """Recover `gid` from the store, or create it: as a founding member of `bootstrap_voters`, or
        empty (a joiner, waiting for the leader's log or snapshot)."""
        self._check_running()
        if gid <= 0:
            raise ValueError("group ids are positive")
        if gid in self._groups:
            raise ValueError(f"group {gid} is already open")
        st = self._store.group(gid)
        snap = st.snapshot()
        hs = st.hard_state
        if not _has_state(st) and bootstrap_voters:
            voters = tuple(sorted(set(bootstrap_voters)))
            if self.raft_id not in voters:
                raise ValueError(f"a founding member must be a voter: {self.raft_id} not in {voters}")
            ents, hs = bootstrap_entries(voters)
            st.append(ents)
            st.set_hard_state(hs)
            self._force_sync = True
            self._on_disk.add(gid)
        elif snap.index > hs.commit:
            # Entries up to the snapshot were applied, hence committed, but the commit-only hard state
            # saying so may not have been synced: the core must not start below its own applied index.
            st.set_hard_state(HardState(hs.term, hs.vote, snap.index))
        if snap.index:
            machine.restore(snap.data)
        raw = RawNode(Config(id=self.raft_id, election_tick=self.election_tick,
                             heartbeat_tick=self.heartbeat_tick, applied=snap.index, rng=random.Random()), st)
        g = Group(self, gid, machine, raw, snap.meta.conf_state, snap.index)
        self._groups[gid] = g
        self._ticking[gid] = g
        machine.on_membership(raw.raft.log.config.current.voters)
        self._arm()
        self._mark(g)  # committed entries above the snapshot are applied again by the next cycle
        return g

    def close_group(self, gid: int, *, delete: bool = False) -> None:
        """Stop hosting `gid` (its waiting proposals fail with GroupClosed). `delete` also removes its
        storage (`RaftLogStore.delete_group`: gone once the next group commit has synced the record)."""
        delete_group = self._store.delete_group if delete else None
        g = self._groups.pop(gid, None)
        if g is None:
            return
        g._closed = True
        for table in (self._ticking, self._dirty, self._proposing):
            table.pop(gid, None)
        g._fail_waiters(GroupClosed(f"group {gid} closed"))
        if delete_group is not None:
            delete_group(gid)
            self._on_disk.discard(gid)

    # -- transport events --------------------------------------------------------------------------------
    def receive(self, from_raft_id: int, payload: Any) -> None:
        """A payload a peer's driver sent us (one per peer per cycle, all groups)."""
        if not self._running:
            return
        try:
            items = decode_batch(payload, from_raft_id, self.raft_id)
        except RaftWireError as exc:
            log.warning("raft driver %d: bad payload from %d dropped: %s", self.raft_id, from_raft_id, exc)
            self.dropped += 1
            return
        groups = self._groups
        for gid, m, quiesce in items:
            g = groups.get(gid)
            if g is None:
                self.dropped += 1
                continue
            g.raw.step(m)
            self.steps += 1
            if quiesce or g._quiesced:
                self._after_quiet_step(g, m, quiesce)
            self._dirty[gid] = g
        self._schedule()

    def peer_down(self, raft_id: int) -> None:
        """The transport lost `raft_id`: its followers wake up (to elect), its leaders stop waiting for it.

        The transport's failure detector stands in for the fixed part of the election timeout: a follower
        of `raft_id` campaigns after the randomized part only (0..election_tick-1 ticks). Safe even if the
        leader is in fact alive: followers that still hear from it are in its lease and ignore the
        pre-vote, so nothing is disrupted."""
        self._down.add(raft_id)
        for g in self._groups.values():
            r = g.raw.raft
            if r.state is _LEADER:
                if raft_id in r.prs.progress:
                    g.raw.report_unreachable(raft_id)
            elif r.lead == raft_id:
                r.election_elapsed = max(r.election_elapsed, r.election_timeout)
                self._wake(g)

    def peer_up(self, raft_id: int) -> None:
        """`raft_id` is reachable again: leaders of its groups wake up to heartbeat and catch it up."""
        self._down.discard(raft_id)
        for g in self._groups.values():
            r = g.raw.raft
            if r.state is _LEADER and raft_id in r.prs.progress:
                self._wake(g)

    # -- scheduling --------------------------------------------------------------------------------------
    def _check_running(self) -> None:
        if not self._running:
            raise GroupClosed(f"raft driver {self.raft_id} is not running"
                              + (f" (failed: {self.failed})" if self.failed else ""))

    def _check_open(self, g: Group) -> None:
        if g._closed:
            raise GroupClosed(f"group {g.gid} is closed")
        self._check_running()

    def _mark(self, g: Group) -> None:
        self._dirty[g.gid] = g
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled and self._running:
            self._scheduled = True
            self._loop.call_soon(self._cycle)

    def _wake(self, g: Group) -> None:
        if g._quiesced and not g._closed:
            g._quiesced = False
            self._ticking[g.gid] = g
            self._arm()

    def _arm(self) -> None:
        if self._timer is None and self._ticking and self._running:
            self._timer = self._loop.call_later(self.tick_s, self._on_tick)

    def _on_tick(self) -> None:
        self._timer = None
        if not self._running or not self._ticking:
            return
        self.tick_rounds += 1
        quiesce = self.quiesce
        for g in list(self._ticking.values()):
            raw = g.raw
            if quiesce and raw.raft.state is _LEADER and self._idle(g):
                self._quiesce_leader(g)
                continue
            raw.tick()
            self.ticks += 1
            if raw.has_ready():
                self._dirty[g.gid] = g
        if self._dirty or self._outbox:
            self._schedule()
        self._arm()

    # -- quiescence --------------------------------------------------------------------------------------
    def _idle(self, g: Group) -> bool:
        r = g.raw.raft
        rlog = r.log
        last = rlog.last_index()
        if rlog.committed != last or g._applied != last or r.lead_transferee or g._proposals:
            return False
        if g.raw.has_ready():
            return False
        down = self._down
        return all(v == r.id or pr.match == last or v in down for v, pr in r.prs.progress.items())

    def _quiesce_leader(self, g: Group) -> None:
        g._quiesced = True
        self._ticking.pop(g.gid, None)
        r = g.raw.raft
        committed = r.log.committed
        for v, pr in r.prs.progress.items():
            if v != r.id and v not in self._down:
                # Like a heartbeat's, the commit index is capped at what the follower is known to hold: a
                # follower may hold a deposed leader's uncommitted entries at higher indexes.
                self._batch(v).add_quiesce(g.gid, r.term, min(pr.match, committed))
        self._schedule()

    def _after_quiet_step(self, g: Group, m: Message, notice: bool) -> None:
        """After stepping a quiesce notice, or any message into a quiesced group: quiesce or wake it."""
        r = g.raw.raft
        if r.state is _LEADER:
            # Answers that change nothing (late acks, answers to the quiesce notice) leave it asleep.
            if g._quiesced and (m.type is not _HB_RESP and m.type is not _APP_RESP or g.raw.has_ready()):
                self._wake(g)
        elif (self.quiesce and r.state is _FOLLOWER and r.lead == m.sender and r.term == m.term
              and r.log.last_index() == r.log.committed and m.sender not in self._down):
            # A caught-up follower of this leader: sleeps on the notice, stays asleep on redundant messages.
            if notice and not g._quiesced:
                g._quiesced = True
                self._ticking.pop(g.gid, None)
        else:
            self._wake(g)

    # -- the cycle ---------------------------------------------------------------------------------------
    def _cycle(self) -> None:
        if self.load is None:
            self._run_cycle()
        else:  # appends, applies, deliveries: the loop's work, for the flow rule
            self.load.timed(self._run_cycle)

    def _run_cycle(self) -> None:
        self._scheduled = False
        if not self._running:
            return
        self.cycles += 1
        try:
            if self._job_done:
                self._complete_sync()
            if self._proposing:
                proposing, self._proposing = self._proposing, {}
                for g in proposing.values():
                    n = g._propose_pending()
                    if n:
                        self.proposals += n
                        self._dirty[g.gid] = g
            if self._dirty:
                dirty, self._dirty = self._dirty, {}
                wal = self._store.wal.log
                for g in dirty.values():
                    raw = g.raw
                    if g._closed or not raw.has_ready():
                        continue
                    rd = raw.ready()
                    self._persist(g, rd)
                    if rd.must_sync:
                        self._unsynced.append((g, rd, wal.last_seq))
                    else:
                        self._finish(g, rd)
            if self._job is None:
                if (not self._deferred and (self._unsynced or self._force_sync)
                        and self.placement.inline()):
                    # a sync on the loop goes last in its turn: the writes the same input scheduled
                    # (deliveries, other connections' answers) go out before the loop blocks in it
                    self._deferred = True
                    self._schedule()
                else:
                    self._deferred = False
                    self._start_sync()
        except Exception as exc:
            self._fail(exc)
            return
        self._send_all()

    def _persist(self, g: Group, rd: Ready) -> None:
        store = self._store
        if rd.snapshot is not None:
            store.apply_snapshot(g.gid, rd.snapshot)  # the file is written and synced now
            self._on_disk.add(g.gid)
        if rd.entries:
            store.append(g.gid, rd.entries)
            self._on_disk.add(g.gid)
        if rd.hard_state is not None:
            store.set_hard_state(g.gid, rd.hard_state)

    def _start_sync(self) -> None:
        store = self._store
        if not self._unsynced and not self._force_sync:
            if store.needs_flush:
                self._flush_store()
            return
        self._force_sync = False
        if store.needs_flush:
            self._flush_store()  # syncs the WAL first: everything written so far is durable
            self._finish_synced(None)  # (and the new WAL generation numbers its records from 1 again)
            return
        job = store.begin_sync()
        if job is None:  # nothing unsynced in the WAL
            self._finish_synced(store.wal.log.synced_seq)
            return
        self._job = job
        placement = self.placement
        if placement.inline():
            placement.run_inline(job.run)  # never raises for an IO failure: complete() does
            self._complete_sync()
            return
        fut = self._loop.run_in_executor(None, placement.measure, job.run)
        self._job_future = fut
        fut.add_done_callback(self._on_sync_done)

    def _on_sync_done(self, fut: asyncio.Future[None]) -> None:
        if self._job_future is fut:
            self._job_future = None
            self._job_done = True
            self._schedule()

    def _complete_sync(self) -> None:
        self._job_done = False
        job, self._job = self._job, None
        assert job is not None
        synced = job.complete()  # raises the job's IO error: the driver fails
        self.fsyncs += 1
        self._finish_synced(synced)

    def _finish_synced(self, synced: int | None) -> None:
        """Finish the Readies whose records are durable: up to WAL seq `synced` (None: all)."""
        if synced is None:
            done, self._unsynced = self._unsynced, []
        else:
            done = [u for u in self._unsynced if u[2] <= synced]
            self._unsynced = [u for u in self._unsynced if u[2] > synced]
        self.synced_readies += len(done)
        self.last_sync_readies = len(done)
        for g, rd, _ in done:
            self._finish(g, rd)

    def _flush_store(self) -> None:
        self._store.flush()
        self.flushes += 1
        self.fsyncs += 1

    def _finish(self, g: Group, rd: Ready) -> None:
        """After `rd` is durable: send its messages, apply, advance."""
        if g._closed:
            return
        gid = g.gid
        for m in rd.messages:
            self._batch(m.to).add(gid, m)
        if rd.snapshot is not None or rd.committed_entries:
            self.commits += g._apply(rd)
            if rd.snapshot is not None:
                self.snapshots_restored += 1
            every = self.snapshot_every
            interval = getattr(g.machine, "snapshot_interval", None)  # machines with their own measure
            if interval is not None and every:
                every = interval()
            if every and g._applied - g._snapshot_index >= every:
                self._take_snapshot(g, every)
        g.raw.advance(rd)
        if g.raw.has_ready():
            self._dirty[gid] = g
            self._schedule()
        if rd.soft_state is not None and rd.soft_state.lead != g._lead:
            g._lead = rd.soft_state.lead
            if g.on_leader_change is not None:
                try:
                    g.on_leader_change(g._lead)
                except Exception:
                    log.exception("group %d: on_leader_change failed", gid)

    def _take_snapshot(self, g: Group, every: int) -> None:
        index = g._applied
        self._store.create_snapshot(g.gid, index, g._conf, g.machine.snapshot())
        g._snapshot_index = index
        self.snapshots_taken += 1
        keep_from = index - min(self.snapshot_every, every) // 2
        cursor = getattr(g.machine, "release_cursor", None)  # entries from it on are still needed
        if cursor is not None:
            keep_from = min(keep_from, cursor() - 1)
        st = self._store.group(g.gid)
        if keep_from >= st.first_index():
            self._store.compact(g.gid, keep_from)

    def _batch(self, peer: int) -> PeerBatch:
        b = self._outbox.get(peer)
        if b is None:
            b = self._outbox[peer] = PeerBatch()
        return b

    def _send_all(self) -> None:
        if not self._outbox:
            return
        outbox, self._outbox = self._outbox, {}
        for peer, batch in outbox.items():
            self.sends += 1
            self.messages_sent += batch.count
            try:
                self._send(peer, batch.payload())
            except Exception:
                log.exception("raft driver %d: send to %d failed", self.raft_id, peer)

    # -- failure -----------------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        """A storage (or internal) failure: nothing more is persisted, sent or applied."""
        log.error("raft driver %d failed: %r", self.raft_id, exc, exc_info=exc)
        self.failed = exc
        self._running = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for g in self._groups.values():
            g._fail_waiters(GroupClosed(f"raft driver {self.raft_id} failed: {exc!r}"))


def _has_state(st: DiskStorage) -> bool:
    """Whether a group's storage holds anything (a group merely looked up is created empty)."""
    return st.last_index() > 0 or st.hard_state.term > 0 or st.snapshot().index > 0
