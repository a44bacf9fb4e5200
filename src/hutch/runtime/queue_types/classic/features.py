"""The runtime side of queue features: clocks, timers and dead-letter routing for classic queues.

Owns: `QueueTimers` (one loop timer per queue, armed at the earliest deadline a queue asks for: the
expiry of its head message or its x-expires, read from the runtime's clock), and
`dead_letter`, which republishes what a queue drops to its dead-letter exchange (core/deadletter.py builds
the message and its x-death header; routing and the cycle check happen here).

Rules:
- Timers fire on the loop; a queue's `on_timer(now)` runs what is due and says when an unused queue
  must be deleted (x-expires), which the node then does as a queue.delete would.
- Dead-lettering is at-most-once for classic queues, as in RabbitMQ: the dead-lettered copy is published
  to the queues the dead-letter exchange routes it to, without confirms. A missing dead-letter exchange
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
from hutch.core.queue_type import Queue
from hutch.queues.classic.queue import ClassicQueue

if TYPE_CHECKING:
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


def dead_letter(node: Node, q: Queue, msgs: list[Message], reason: str) -> list[bool]:
    """Republish `msgs` to the queue's dead-letter exchange; per message, whether it reached at least
    one queue and no queue refused it (what at-least-once dead-lettering settles on)."""
    settings = q.settings
    dlx_name = settings.dead_letter_exchange
    vhost = node.vhosts.get(q.vhost)
    if dlx_name is None or vhost is None:
        return [False] * len(msgs)
    x = vhost.exchanges.get(dlx_name)
    if x is None:
        log.warning("queue '%s' in vhost '%s': dead-letter exchange '%s' does not exist; %d message(s) dropped",
                    q.name, q.vhost, dlx_name, len(msgs))
        return [False] * len(msgs)
    now_s = node.clock.wall_ms() // 1000
    out = []
    for msg in msgs:
        new, keys = make_dead_letter(msg, queue=q.name, reason=reason, now_s=now_s, dlx=dlx_name,
                                     dlrk=settings.dead_letter_routing_key, history=not msg.foreign_deaths)
        routed, refused = False, False
        for target in vhost.route(x, keys, new.properties.headers):
            if is_cycle(new, target.name):
                continue
            routed = True
            if target.publish(new) is False:
                refused = True
        out.append(routed and not refused)
    return out
