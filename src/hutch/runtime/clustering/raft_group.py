"""One Raft group as the driver hosts it: the `Group` handle, the state machine protocol, the errors.

Owns, per group: the proposals waiting for the next driver cycle (batched into one `propose_batch`),
the proposers waiting for their entry to be applied on this node (index -> (term, future)), applying
committed entries and snapshots to the `StateMachine` in order, and the configuration as of the applied
index (what a snapshot records). Everything about IO, time and scheduling is the driver's
(raft_driver.py); a `Group` asks it for a cycle with `_mark`/`_schedule` and to tick again with `_wake`.

Rules:
- A proposer's future resolves when its entry is applied here: with `apply`'s return value (or the
  exception it raised); with `ProposalLost` when an entry of a newer term is applied at or before its
  index (terms never decrease along a log, so its entry was overwritten); with `ProposalTimeout` when a
  snapshot replaced it (outcome unknown). Proposals are only accepted by a leader (`NotLeader` at once
  otherwise) and never empty (an empty NORMAL entry is a new leader's no-op, not applied).
- Invariant: the machine reflects exactly the entries up to `_applied`, and `_conf` is the
  configuration in force at `_applied`.
- Loop thread only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from hutch.raft import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    ProposalDroppedError,
    RawNode,
    Ready,
    StateType,
)

if TYPE_CHECKING:
    import asyncio

log = logging.getLogger("hutch.raft")

_LEADER = StateType.LEADER
_ROLE = {StateType.FOLLOWER: "follower", StateType.PRE_CANDIDATE: "pre_candidate",
         StateType.CANDIDATE: "candidate", StateType.LEADER: "leader"}


class GroupHost(Protocol):
    """What a `Group` asks of the driver that hosts it (raft_driver.py's `RaftDriver`)."""

    _loop: asyncio.AbstractEventLoop
    _proposing: dict[int, Group]
    tick_s: float

    def _check_open(self, g: Group) -> None: ...

    def _mark(self, g: Group) -> None: ...

    def _schedule(self) -> None: ...

    def _wake(self, g: Group) -> None: ...


class StateMachine(Protocol):
    def apply(self, index: int, data: bytes) -> Any:
        """A committed NORMAL entry; the return value resolves the proposer's future on this node.
        Must be deterministic (an exception is logged, given to the proposer, and the entry counts as applied)."""
        ...

    def snapshot(self) -> bytes:
        """The state as of the last applied index."""
        ...

    def restore(self, data: bytes) -> None:
        """Replace the state with a snapshot's."""
        ...

    def on_membership(self, voters: tuple[int, ...]) -> None:
        """After a configuration change is applied, and once at start (the group's latest configuration)."""
        ...


class NotLeader(Exception):
    """This node is not the group's leader; `leader` is the leader it knows (0 if unknown)."""

    def __init__(self, leader: int = 0, reason: str = "not the leader") -> None:
        super().__init__(f"{reason} (leader: {leader or 'unknown'})")
        self.leader = leader


class ProposalLost(NotLeader):
    """The proposal's entry was overwritten by another leader's: it will never be applied (safe to retry)."""


class ProposalTimeout(Exception):
    """Not applied on this node in time (no majority, say); it may still be applied later."""


class GroupClosed(Exception):
    """The group was closed, or its driver stopped or failed, before the proposal was applied."""


Waiter = tuple[int, "asyncio.Future[Any]"]  # (term the entry was proposed in, future)


class Group:
    """One Raft group hosted by a `RaftDriver` (made by `RaftDriver.open_group`)."""

    def __init__(self, driver: GroupHost, gid: int, machine: StateMachine, raw: RawNode,
                 conf: ConfState, applied: int) -> None:
        self.gid = gid
        self.on_leader_change: Callable[[int], None] | None = None
        self.machine = machine
        self.raw = raw
        self._driver = driver
        self._conf = conf  # Invariant: the configuration as of `_applied` (what a snapshot at it records)
        self._applied = applied  # Invariant: the machine reflects exactly the entries up to here
        self._snapshot_index = applied
        self._waiters: dict[int, Waiter] = {}  # entry index -> proposer, until applied here
        self._min_waiter_term = 0  # Invariant: <= the term of every waiter (0 when there is none)
        # until the next cycle proposes them; no future for a `propose_fire`
        self._proposals: list[tuple[bytes, asyncio.Future[Any] | None]] = []
        self._quiesced = False
        self._closed = False
        self._lead = raw.raft.lead  # as last reported to on_leader_change

    # -- proposals ---------------------------------------------------------------------------------------
    def propose_nowait(self, data: bytes) -> asyncio.Future[Any]:
        """`propose` without the wait: a future for `apply`'s return value (proposed in the next cycle)."""
        d = self._driver
        d._check_open(self)
        if not data:
            raise ValueError("empty proposals are not allowed (an empty entry is a leader's no-op)")
        r = self.raw.raft
        if r.state is not _LEADER:
            raise NotLeader(r.lead)
        if r.lead_transferee:
            raise NotLeader(r.lead_transferee, "leadership transfer in progress")
        fut: asyncio.Future[Any] = d._loop.create_future()
        self._proposals.append((data, fut))
        d._proposing[self.gid] = self
        d._wake(self)
        d._schedule()
        return fut

    def propose_fire(self, data: bytes) -> None:
        """`propose_nowait` for a caller that learns the outcome otherwise (a quorum queue's effects):
        no future, no waiter (the hot path of enqueue/settle). Raises as `propose_nowait` does."""
        d = self._driver
        d._check_open(self)
        r = self.raw.raft
        if r.state is not _LEADER:
            raise NotLeader(r.lead)
        if r.lead_transferee:
            raise NotLeader(r.lead_transferee, "leadership transfer in progress")
        self._proposals.append((data, None))
        d._proposing[self.gid] = self
        d._wake(self)
        d._schedule()

    async def propose(self, data: bytes, timeout: float = 5.0) -> Any:
        fut = self.propose_nowait(data)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ProposalTimeout(f"group {self.gid}: not applied within {timeout} s") from None

    async def add_voter(self, raft_id: int, timeout: float = 10.0) -> None:
        await self._conf_change(ConfChange(ConfChangeType.ADD_NODE, raft_id), timeout)

    async def remove_voter(self, raft_id: int, timeout: float = 10.0) -> None:
        await self._conf_change(ConfChange(ConfChangeType.REMOVE_NODE, raft_id), timeout)

    async def _conf_change(self, cc: ConfChange, timeout: float) -> None:
        d = self._driver
        d._check_open(self)
        deadline = d._loop.time() + timeout
        while True:
            r = self.raw.raft
            if r.state is not _LEADER:
                raise NotLeader(r.lead)
            try:
                index = self.raw.propose_conf_change(cc)
                break
            except ProposalDroppedError as exc:
                # A change in progress, or a new leader's first entry not yet committed: wait for it.
                if exc.leader != r.id or d._loop.time() >= deadline:
                    if exc.leader == r.id:
                        raise ProposalTimeout(f"group {self.gid}: {exc}") from None
                    raise NotLeader(exc.leader, str(exc)) from None
                await asyncio.sleep(d.tick_s)
                d._check_open(self)
        fut: asyncio.Future[Any] = d._loop.create_future()
        self._add_waiter(index, r.term, fut)
        d._wake(self)
        d._mark(self)
        try:
            await asyncio.wait_for(fut, max(deadline - d._loop.time(), 0.001))
        except TimeoutError:
            raise ProposalTimeout(f"group {self.gid}: {cc.type.name} {cc.node_id} not applied in time") from None

    def _add_waiter(self, index: int, term: int, fut: asyncio.Future[Any]) -> None:
        if not self._waiters or term < self._min_waiter_term:
            self._min_waiter_term = term
        self._waiters[index] = (term, fut)

    # -- operator actions --------------------------------------------------------------------------------
    def transfer_leader(self, raft_id: int) -> None:
        self._driver._check_open(self)
        self.raw.transfer_leader(raft_id)
        self._driver._wake(self)
        self._driver._mark(self)

    def campaign(self) -> None:
        self._driver._check_open(self)
        self.raw.campaign()
        self._driver._wake(self)
        self._driver._mark(self)

    # -- the driver's side -----------------------------------------------------------------------------
    def _propose_pending(self) -> int:
        """Hand the batched proposals to the core (one append); returns how many were proposed."""
        props, self._proposals = self._proposals, []
        live = [(data, fut) for data, fut in props if fut is None or not fut.done()]
        if not live or self._closed:
            return 0
        try:
            last = self.raw.propose_batch([data for data, _ in live])
        except ProposalDroppedError as exc:
            for _, fut in live:
                if fut is not None:
                    fut.set_exception(NotLeader(exc.leader, str(exc)))
            return 0
        term = self.raw.raft.term
        first = last - len(live) + 1
        for i, (_, fut) in enumerate(live):
            if fut is not None:
                self._add_waiter(first + i, term, fut)
        return len(live)

    def _apply(self, rd: Ready) -> int:
        """Apply `rd`'s snapshot and committed entries (after they are durable); returns the NORMAL entries
        applied. Resolves the proposers waiting here."""
        commits = 0
        machine = self.machine
        if rd.snapshot is not None:
            snap = rd.snapshot
            machine.restore(snap.data)
            self._applied = self._snapshot_index = snap.index
            self._conf = snap.meta.conf_state
            machine.on_membership(self._conf.voters)
            for index in [i for i in self._waiters if i <= snap.index]:
                _, fut = self._waiters.pop(index)
                if not fut.done():
                    fut.set_exception(ProposalTimeout(f"group {self.gid}: entry {index} was replaced by a "
                                                      "snapshot; outcome unknown"))
        for e in rd.committed_entries:
            if e.index <= self._applied:
                continue
            result: Any = None
            error: BaseException | None = None
            if e.type is EntryType.NORMAL:
                if e.data:
                    commits += 1
                    try:
                        result = machine.apply(e.index, e.data)
                    except Exception as exc:
                        log.exception("group %d: apply of entry %d failed", self.gid, e.index)
                        error = exc
            else:
                self._conf = ConfChange.decode(e.data).apply_to(self._conf)
                machine.on_membership(self._conf.voters)
            self._applied = e.index
            if self._waiters:
                self._resolve(e, result, error)
        return commits

    def _resolve(self, e: Entry, result: Any, error: BaseException | None) -> None:
        waiter = self._waiters.pop(e.index, None)
        if waiter is not None:
            term, fut = waiter
            if not fut.done():
                if term != e.term:
                    fut.set_exception(ProposalLost(self.raw.raft.lead, f"group {self.gid}: entry {e.index} overwritten"))
                elif error is not None:
                    fut.set_exception(error)
                else:
                    fut.set_result(result)
        if self._waiters and e.term > self._min_waiter_term:
            # Terms never decrease along a log: every waiter of an older term is at an index whose entry
            # will have at least e.term, so none of them can be applied any more.
            for index in [i for i, (t, _) in self._waiters.items() if t < e.term]:
                _, fut = self._waiters.pop(index)
                if not fut.done():
                    fut.set_exception(ProposalLost(self.raw.raft.lead, f"group {self.gid}: entry {index} overwritten"))
            self._min_waiter_term = min((t for t, _ in self._waiters.values()), default=0)

    def _fail_waiters(self, exc: BaseException) -> None:
        waiting = [fut for _, fut in self._proposals if fut is not None] + \
            [fut for _, fut in self._waiters.values()]
        self._proposals = []
        self._waiters = {}
        self._min_waiter_term = 0
        for fut in waiting:
            if not fut.done():
                fut.set_exception(exc)

    # -- introspection -----------------------------------------------------------------------------------
    @property
    def leader(self) -> int:
        return self.raw.raft.lead

    @property
    def is_leader(self) -> bool:
        return self.raw.raft.state is _LEADER

    @property
    def term(self) -> int:
        return self.raw.raft.term

    @property
    def quiesced(self) -> bool:
        return self._quiesced

    @property
    def applied(self) -> int:
        return self._applied

    def status(self) -> dict[str, Any]:
        r = self.raw.raft
        out: dict[str, Any] = {
            "id": r.id, "gid": self.gid, "leader": r.lead, "term": r.term, "commit": r.log.committed,
            "applied": self._applied, "first_index": r.log.first_index(), "last_index": r.log.last_index(),
            "voters": list(r.log.config.current.voters), "role": _ROLE[r.state], "quiesced": self._quiesced,
        }
        if r.state is _LEADER:
            out["progress"] = {v: {"match": pr.match, "next": pr.next, "state": pr.state.name.lower()}
                               for v, pr in r.prs.progress.items() if v != r.id}
        return out

    def __repr__(self) -> str:
        r = self.raw.raft
        return f"Group({self.gid} on {r.id}: {_ROLE[r.state]} term={r.term} lead={r.lead})"
