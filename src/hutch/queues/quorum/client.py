"""The sending side of a quorum queue's commands that leave this node: `CommandTracker`.

Owns what rabbit_fifo_client keeps for a quorum queue on a node that does not lead it (a follower, or a
node that is not a member at all): the commands (settle, return, discard, cancel, checkout, credit, ...)
sent to the leader, directly or through a member that relays them, and not yet known to be applied,
each under a sequence number of this node; and the `leader_hint`, the node a non-member last heard the
leader's answers from, so that it sends to the leader itself rather than through a relay.

Rules:
- A command is tracked when it leaves this node and forgotten when the leader reports it applied
  (`applied`). Anything else (the leader or the relay died, lost its leadership, dropped the command for
  want of a leader) is found out by waiting: the runtime resends every unapplied command, in sequence
  order, when the route changes (a node went down, the leader changed) and those older than its resend
  interval on its tick (`due`).
- A resend can apply a command twice, which the machine makes harmless: a msg id is a raft index,
  never reused, and a settle, discard or return of an id not checked out to that consumer key is a
  no-op, a cancel of a cancelled consumer is a no-op and a checkout of a live one updates it (a return
  applied twice can only hand a message out once more, never lose one: at-least-once, as RabbitMQ).
- Commands are resent in sequence order, so that one consumer's checkout, settles and cancel reach the
  leader in the order they were made.
- Bounded: at most `limit` commands are tracked; past it the oldest is dropped (and counted), as a
  command no leader has taken for that long would not be taken by a resend either.
- Pure: time is the caller's (`now`, seconds, monotonic); no IO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(slots=True)
class Sent:
    """One tracked command: its bytes, where it went last and when (the caller's clock)."""

    data: bytes
    target: str
    sent_at: float


@dataclass(slots=True)
class CommandTracker:
    """The unapplied commands this node sent towards one quorum queue's leader, by sequence number."""

    limit: int
    # Invariant: keys increase in insertion order (sequence order), so iteration resends in order.
    unapplied: dict[int, Sent] = field(default_factory=dict)
    leader_hint: str | None = None  # a non-member's guess at the leader: whoever last answered as it
    dropped: int = 0  # commands given up because more than `limit` were waiting
    _last_seq: int = 0

    def track(self, seq: int, data: bytes, target: str, now: float) -> None:
        """`data` was sent to `target` as command `seq` (greater than every seq tracked before)."""
        assert seq > self._last_seq, "sequence numbers must increase"
        assert data, "an empty command"
        self._last_seq = seq
        self.unapplied[seq] = Sent(data, target, now)
        while len(self.unapplied) > self.limit:
            del self.unapplied[next(iter(self.unapplied))]
            self.dropped += 1

    def applied(self, seqs: Iterable[int], leader: str | None = None) -> int:
        """The leader (`leader`, when known) applied these seqs: forget them; returns how many were tracked."""
        if leader is not None:
            self.leader_hint = leader
        pop = self.unapplied.pop
        n = 0
        for seq in seqs:
            if pop(seq, None) is not None:
                n += 1
        return n

    def resend_all(self, now: float) -> list[tuple[int, bytes]]:
        """Every unapplied command, in sequence order, stamped as sent now (the route changed)."""
        out = []
        for seq, sent in self.unapplied.items():
            sent.sent_at = now
            out.append((seq, sent.data))
        return out

    def due(self, now: float, older_than_s: float) -> list[tuple[int, bytes]]:
        """The commands sent more than `older_than_s` ago and not applied: when one is due, every one after
        it is resent too (in order), so that nothing overtakes a command it followed."""
        limit = now - older_than_s
        out: list[tuple[int, bytes]] = []
        for seq, sent in self.unapplied.items():
            if out or sent.sent_at < limit:
                sent.sent_at = now
                out.append((seq, sent.data))
        return out

    def sent_to(self, seq: int, target: str) -> None:
        """Command `seq` was (re)sent to `target`."""
        sent = self.unapplied.get(seq)
        if sent is not None:
            sent.target = target

    def route_lost(self, node: str) -> bool:
        """`node` went down: forget it as the leader hint; True when a command was last sent through it."""
        if self.leader_hint == node:
            self.leader_hint = None
        return any(sent.target == node for sent in self.unapplied.values())

    def waiting_for_route(self) -> bool:
        """True when a command was never sent anywhere (no member was reachable when it was made)."""
        return any(not sent.target for sent in self.unapplied.values())

    def clear(self) -> None:
        self.unapplied.clear()
        self.leader_hint = None
