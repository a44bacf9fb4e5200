"""Quorum queues at run time: where a queue's leader goes and who its members are.

Owns `QuorumMembership`, the part of `QuorumService` (quorum_service.py, which inherits it) that places
leaders and changes members: the leader locator's choice at declaration and the hand-over to it, the
member list kept in the metadata with the Raft configuration (`hutch-queues add_member`,
`delete_member`, `grow`, `shrink`), `quorum_status`, and leadership transfers (`rebalance`).

Rules:
- Membership changes go through the leader, one server at a time, and need a quorum of the current
  members (`ProposalTimeout` otherwise); the metadata's member list changes first when adding (the new
  member opens the group empty and catches up) and last when removing.
- Balanced leader locator: the running node that leads the fewest quorum queues (this node among
  equals), or a random running node at BALANCED_MAX_QUEUES quorum queues or more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hutch.cluster import messages as cm
from hutch.core.vhost import rs
from hutch.runtime.queue_types.quorum.queue import BALANCED_MAX_QUEUES, CALL_TIMEOUT_S, QuorumQueue, log

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService
    from hutch.runtime.clustering.transport import Transport


class QuorumMembership:
    """Leader placement and membership of the node's quorum queues (mixed into QuorumService)."""

    name: str
    node: Node
    cluster: ClusterService
    transport: Transport
    queues: dict[int, QuorumQueue]
    _leader_waiters: dict[int, list[asyncio.Future[None]]]  # gid -> woken at its next leader change

    if TYPE_CHECKING:  # QuorumService's, which inherits this class
        def is_leader(self, q: QuorumQueue) -> bool: ...
        def leader_name(self, q: QuorumQueue) -> str | None: ...
        def _target(self, q: QuorumQueue, forwarded: bool = False) -> str | None: ...
        def attach(self, q: QuorumQueue, campaign: bool, joining: bool = False) -> None: ...
        async def _forward_or(self, q: QuorumQueue, req: Any) -> Any | None: ...
        def _queue(self, gid: int) -> QuorumQueue: ...

    def choose_leader(self, locator: str) -> str:
        """The node a new quorum queue's leader goes to: this one (client-local), or (balanced) the
        running node that leads the fewest quorum queues (this one among equals), or a random running
        node once there are BALANCED_MAX_QUEUES quorum queues or more."""
        if locator != "balanced":
            return self.name
        import random
        running = [self.name, *sorted(m for m in self.cluster.machine.members
                                      if m != self.name and self.transport.connected(m))]
        if len(self.queues) >= BALANCED_MAX_QUEUES:
            return random.choice(running)
        leads = dict.fromkeys(running, 0)
        for q in self.queues.values():
            lead = self.leader_name(q) or (q.members[0] if q.members else None)  # else: the locator's choice
            if lead in leads:
                leads[lead] += 1
        return min(running, key=lambda m: leads[m])

    async def elect(self, q: QuorumQueue) -> None:
        """After the declaration committed (and the other members opened the group): the declaring
        node campaigns and waits, briefly, for a leader; when the leader locator chose another member
        (the first one), it then hands the leadership over to it."""
        await self.cluster.sync_peers()
        if q.replica is not None and not q.replica.group.leader:
            q.replica.group.campaign()
        await self.wait_for_leader(q, lambda: self.leader_name(q) is not None, CALL_TIMEOUT_S)
        target = q.members[0] if q.members else self.name
        if target != self.name and self.is_leader(q) and self.transport.connected(target):
            try:
                self.transfer_leader(q, target)
            except (ValueError, LookupError) as exc:
                log.warning("quorum queue '%s': leader locator: %s", q.name, exc)
                return
            await self.wait_for_leader(q, lambda: self.leader_name(q) == target, CALL_TIMEOUT_S)

    async def wait_for_leader(self, q: QuorumQueue, ready: Callable[[], bool], timeout: float) -> None:
        """Until `ready()` (a condition on the queue's leader) holds, or `timeout` s: woken by each
        leader change of the queue's group (`_leader_changed`), not by polling."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._leader_waiters.setdefault(q.gid, []).append(fut)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, remaining)

    # -- membership (hutch-queues add_member / delete_member / grow / shrink) ------------------------------
    def members_changed(self, q: QuorumQueue, members: list[str]) -> None:
        """The metadata says the queue's members are now `members` (every node applies this)."""
        added = self.name in members and self.name not in q.members
        removed = self.name in q.members and self.name not in members
        q.members = list(members)
        if added:
            self.attach(q, campaign=False, joining=True)
        elif removed and q.replica is not None and self.cluster.driver is not None:
            self.cluster.driver.close_group(q.gid, delete=True)
            q.replica = None

    async def add_member(self, q: QuorumQueue, name: str) -> None:
        """Add `name` as a member: it opens the group empty (metadata), then the leader adds it as a
        voter; it catches up from the log or a snapshot. Needs a quorum (ProposalTimeout otherwise)."""
        if name not in self.cluster.machine.members:
            raise LookupError(f"node {name!r} is not a member of this cluster")
        if name in q.members:
            raise ValueError(f"node {name!r} is already a member of {rs('queue', q.name, q.vhost)}")
        await self._on_leader(q, cm.QuorumMember(q.gid, name, True))

    async def delete_member(self, q: QuorumQueue, name: str) -> None:
        if name not in q.members:
            raise LookupError(f"node {name!r} is not a member of {rs('queue', q.name, q.vhost)}")
        if len(q.members) == 1:
            raise ValueError(f"cannot remove the last member of {rs('queue', q.name, q.vhost)}")
        await self._on_leader(q, cm.QuorumMember(q.gid, name, False))

    async def _on_leader(self, q: QuorumQueue, req: cm.QuorumMember) -> Any:
        if self.is_leader(q):
            return await self._h_member(self.name, req)
        target = self._target(q)
        if target is None:
            raise ValueError(f"{rs('queue', q.name, q.vhost)} has no leader (no majority of its members)")
        return await self.cluster.call(target, req, timeout=CALL_TIMEOUT_S * 4)

    async def _h_member(self, peer: str, req: cm.QuorumMember) -> Any:
        q = self._queue(req.gid)
        forwarded = await self._forward_or(q, req)
        if forwarded is not None:
            return forwarded
        assert q.replica is not None
        group = q.replica.group
        vhost = self.node.vhosts[q.vhost]
        name = req.node
        if req.add:
            if name not in q.members:
                self.node.set_queue_members(vhost, q, [*q.members, name])
                await self.cluster.wait_replicated()
                await self.cluster.sync_peers()
            await group.add_voter(self.cluster.raft_id_of(name), timeout=CALL_TIMEOUT_S * 2)
        else:
            await group.remove_voter(self.cluster.raft_id_of(name), timeout=CALL_TIMEOUT_S * 2)
            if name in q.members:
                self.node.set_queue_members(vhost, q, [m for m in q.members if m != name])
                await self.cluster.wait_replicated()
        return True

    def status(self, q: QuorumQueue) -> list[dict[str, Any]]:
        """quorum_status: per member, its Raft role, term and log indexes as this node knows them."""
        rows: list[dict[str, Any]] = []
        st = q.replica.group.status() if q.replica is not None else {}
        progress = st.get("progress") or {}
        for m in q.members:
            raft_id = self.cluster.raft_id_of(m)
            row: dict[str, Any] = {"node": m, "raft_id": raft_id,
                                   "online": m == self.name or self.transport.connected(m)}
            if m == self.name and st:
                row.update(role=st.get("role"), term=st.get("term"), commit_index=st.get("commit"),
                           last_applied=st.get("applied"), first_index=st.get("first_index"),
                           last_index=st.get("last_index"))
            elif raft_id in progress:
                pr = progress[raft_id]
                row.update(role="follower", match_index=pr.get("match") if isinstance(pr, dict) else None)
            rows.append(row)
        return rows

    def transfer_leader(self, q: QuorumQueue, name: str) -> None:
        """Hand the leadership of `q` to its member `name` (hutch-queues rebalance); on the leader only.
        Raft finishes the transfer once `name` is caught up, or abandons it after an election timeout."""
        if not self.is_leader(q):
            raise ValueError(f"node {self.name!r} does not lead {rs('queue', q.name, q.vhost)}")
        if name not in q.members:
            raise LookupError(f"node {name!r} is not a member of {rs('queue', q.name, q.vhost)}")
        assert q.replica is not None
        q.replica.group.transfer_leader(self.cluster.raft_id_of(name))
