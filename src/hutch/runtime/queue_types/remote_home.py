"""At a queue's home: the objects that stand for another node (or worker) inside the home's own queues.

Owns: `RemoteDeliverer` (the channel of a consumer on another node, as the home's queue delivers to it
and judges its socket), `FlowHold` (the publishers of another node held by one queue here, as a held
connection waits in the queue's `flow_waiters`) and `PeerConfirms` (the confirm owner of the publishes
another node sent here, answered by publish id). Each hands what it learns to the node's queue link
(`HomeLink`, implemented by remote.py's `QueueLink`), which writes the records.

Rules:
- Nothing here writes to the transport: the link batches and orders per peer (remote.py).
- A consumer paused by its node (`RemoteConsumerPaused`) or behind a full link gets nothing
  (`RemoteDeliverer.can_take`), and the queue's flow rule sees it as a consumer held by its socket.
- A `FlowHold` is registered in the link's `flow_holds` exactly while its peer was told to hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, Protocol

from hutch.core.queue_type import Consumer, Queue, QueueEntry

if TYPE_CHECKING:
    from hutch.runtime.clustering.transport import Transport

FLOW_RECHECK_S = 0.1  # how often a home asks a queue that holds another node's publishers whether it still does


class HomeLink(Protocol):
    """What the home's stand-ins for another node ask of the queue link (remote.py's `QueueLink`)."""

    transport: Transport
    flow_holds: dict[tuple[str, int], FlowHold]

    def deliver_remote(self, d: RemoteDeliverer, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None: ...

    def drop_remote_consumer(self, peer: str, cid: int, notify: bool = False) -> None: ...

    def send_flow(self, peer: str, q: Queue, hold: bool) -> None: ...

    def confirm_out(self, peer: str, ok: bool, pid: int) -> None: ...


class RemoteDeliverer:
    """At the home node: the channel of a consumer that is on another node. `paused`: that node said the
    consumer's connection has a full write buffer (`RemoteConsumerPaused`): nothing is delivered to it
    until it says otherwise, and the queue's flow rule sees a consumer held by its socket."""

    def __init__(self, link: HomeLink, peer: str, cid: int) -> None:
        self.link = link
        self.peer = peer
        self.cid = cid
        self.paused = False

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None:
        self.link.deliver_remote(self, consumer, queue, entry)

    def can_take(self) -> bool:
        return not self.paused and self.link.transport.writable(self.peer)

    @property
    def conn(self) -> RemoteDeliverer:
        """The consumer's connection as a queue's flow check sees it: the link to the peer."""
        return self

    @property
    def write_paused(self) -> bool:
        return self.paused or not self.link.transport.writable(self.peer)

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        self.link.drop_remote_consumer(self.peer, self.cid, notify=True)


class FlowHold:
    """At the home: the publishers of one other node (or worker) held by one queue here. It waits in the
    queue's `flow_waiters` as a held connection does (`flow_unblock` when the queue lets go), and asks
    the queue every `FLOW_RECHECK_S` whether its rule still holds, as a held connection's recheck does;
    letting go sends `RemoteHold(hold=False)` to the peer.
    Invariant: registered in `QueueLink.flow_holds` exactly while the peer was told to hold."""

    def __init__(self, link: HomeLink, peer: str, queue: Queue) -> None:
        self.link = link
        self.peer = peer
        self.queue = queue
        self.timer = asyncio.get_running_loop().call_later(FLOW_RECHECK_S, self._recheck)

    def _recheck(self) -> None:
        q = self.queue
        if q.deleted or not q.flow_still_needed():
            q.flow_waiters.discard(self)
            self.flow_unblock(q)
        else:
            self.timer = asyncio.get_running_loop().call_later(FLOW_RECHECK_S, self._recheck)

    def flow_unblock(self, queue: Any) -> None:
        self.timer.cancel()
        if self.link.flow_holds.pop((self.peer, id(self.queue)), None) is self:
            self.link.send_flow(self.peer, self.queue, False)

    def drop(self) -> None:
        """The peer went away: forget the hold without telling it."""
        self.timer.cancel()
        self.queue.flow_waiters.discard(self)


class PeerConfirms:
    """At the home node: the ConfirmOwner of the publishes one other node sent here (its publish ids),
    answered to that node with `RemoteConfirm` as the local queues settle or reject them."""

    def __init__(self, link: HomeLink, peer: str) -> None:
        self.link = link
        self.peer = peer
        self.pending: dict[int, Hashable] = {}  # publish id -> the queue that still has to settle it

    def settle(self, seq: int, queue: Hashable) -> None:
        if self.pending.pop(seq, None) is not None:
            self.link.confirm_out(self.peer, True, seq)

    def reject(self, seq: int, queue: Hashable, error: str | None) -> None:
        if self.pending.pop(seq, None) is not None:
            self.link.confirm_out(self.peer, False, seq)

    def queue_deleted(self, queue: Hashable) -> None:
        for pid in [pid for pid, q in self.pending.items() if q is queue]:
            self.settle(pid, queue)

