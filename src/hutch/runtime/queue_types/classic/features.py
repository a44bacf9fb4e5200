"""The runtime side of queue features: clocks, timers and dead-letter routing for classic queues.

Owns: `QueueTimers` (one loop timer per queue, armed at the earliest deadline a queue asks for: the
expiry of its head message or its x-expires, read from the runtime's clock), and
`dead_letter` / `dead_letter_confirmed`, which republish what a queue drops to its dead-letter exchange (core/deadletter.py builds
the message and its x-death header; routing and the cycle check happen here).

Rules:
- Timers fire on the loop; a queue's `on_timer(now)` runs what is due and says when an unused queue
  must be deleted (x-expires), which the node then does as a queue.delete would.
- Dead-lettering is at-most-once for classic queues, as in RabbitMQ: the dead-lettered copy is published
  to the queues the dead-letter exchange routes it to, without confirms. Quorum queues' at-least-once
  dead-lettering publishes each copy with a receipt of a `ConfirmBatch` (`dead_letter_confirmed`). A missing dead-letter exchange
  drops the message (logged once per queue). A route that would bring a message back to a queue it
  expired from, without a rejection on the way, is a cycle and is dropped (RabbitMQ's rule).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from hutch.core.deadletter import dead_letter as make_dead_letter
from hutch.core.deadletter import is_cycle
from hutch.core.message import Message
from hutch.core.queue_type import PENDING, REJECTED, Queue
from hutch.queues.classic.queue import ClassicQueue

if TYPE_CHECKING:
    from hutch.core.confirms import ConfirmBatch, Receipt
    from hutch.core.routing import Exchange
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.broker.node import Node
    from hutch.runtime.ports import Clock

log = logging.getLogger("hutch.queue_features")


class QueueTimers:
    """One timer per queue, at the earliest deadline it asked for."""

    def __init__(self, node: Node, clock: Clock) -> None:
        self.node = node
        self.clock = clock
        self._handles: dict[ClassicQueue, tuple[int, asyncio.TimerHandle]] = {}

    def request(self, q: ClassicQueue, at_ms: int) -> None:
        current = self._handles.get(q)
        if current is not None:
            if current[0] <= at_ms:
                return
            current[1].cancel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # start-up (recovery) before the loop runs: armed again on first use
            return
        delay = max(0.0, (at_ms - self.clock.wall_ms()) / 1000)
        self._handles[q] = (at_ms, loop.call_later(delay, self._fire, q))

    def _fire(self, q: ClassicQueue) -> None:
        self._handles.pop(q, None)
        if q.deleted:
            return
        if q.on_timer(self.clock.wall_ms()):
            vhost = self.node.vhosts.get(q.vhost)
            if vhost is not None and vhost.queues.get(q.name) is q:
                log.info("queue '%s' in vhost '%s' expired (x-expires): deleted", q.name, q.vhost)
                self.node.delete_queue(vhost, q)

    def cancel(self, q: ClassicQueue) -> None:
        current = self._handles.pop(q, None)
        if current is not None:
            current[1].cancel()

    def cancel_all(self) -> None:
        for _at, handle in self._handles.values():
            handle.cancel()
        self._handles.clear()


def attach(node: Node, timers: QueueTimers, q: ClassicQueue) -> None:
    """Wire a classic queue to the runtime: timers, dead-lettering, and its first use (x-expires)."""
    q.timer = timers.request
    q.dead_letterer = lambda queue, msgs, reason: dead_letter(node, queue, msgs, reason)
    q.touch(timers.clock.wall_ms())


def dead_letter(node: Node, q: Queue, msgs: list[Message], reason: str) -> None:
    """Republish `msgs` to the queue's dead-letter exchange, at most once (no confirms)."""
    target = _dead_letter_exchange(node, q, len(msgs))
    if target is None:
        return
    now_s = node.clock.wall_ms() // 1000
    for msg in msgs:
        _republish(target, q, msg, reason, now_s, None)


def dead_letter_confirmed(node: Node, q: Queue, msg: Message, reason: str, batch: ConfirmBatch) -> int:
    """At-least-once dead-lettering: republish `msg` with the next receipt of `batch`; returns its
    sequence number there. It is acked in the batch once every queue it was routed to settled it; no
    route, a missing exchange or a refusal makes it a nack (the message stays to be tried again)."""
    receipt = batch.receipt()
    target = _dead_letter_exchange(node, q, 1)
    if target is None:
        batch.published(receipt.seq, None, True)
    else:
        routed, refused, pending = _republish(target, q, msg, reason, node.clock.wall_ms() // 1000, receipt)
        batch.published(receipt.seq, pending, refused or not routed)
    return receipt.seq


def _dead_letter_exchange(node: Node, q: Queue, count: int) -> tuple[VirtualHost, Exchange] | None:
    dlx_name = q.settings.dead_letter_exchange
    vhost = node.vhosts.get(q.vhost)
    if dlx_name is None or vhost is None:
        return None
    x = vhost.exchanges.get(dlx_name)
    if x is None:
        log.warning("queue '%s' in vhost '%s': dead-letter exchange '%s' does not exist; %d message(s) dropped",
                    q.name, q.vhost, dlx_name, count)
        return None
    return vhost, x


def _republish(target: tuple[VirtualHost, Exchange], q: Queue, msg: Message, reason: str, now_s: int,
               receipt: Receipt | None) -> tuple[bool, bool, list[Queue] | None]:
    """Route the dead-lettered copy of `msg`: (routed somewhere, refused by a queue, queues pending)."""
    vhost, x = target
    settings = q.settings
    new, keys = make_dead_letter(msg, queue=q.name, reason=reason, now_s=now_s, dlx=x.name,
                                 dlrk=settings.dead_letter_routing_key, history=not msg.foreign_deaths)
    routed, refused = False, False
    pending: list[Queue] | None = None
    for queue in vhost.route(x, keys, new.properties.headers, new):
        if is_cycle(new, queue.name):
            continue
        routed = True
        result = queue.publish(new, receipt)
        if result is REJECTED:
            refused = True
        elif result is PENDING:
            pending = [queue] if pending is None else [*pending, queue]
    return routed, refused, pending
