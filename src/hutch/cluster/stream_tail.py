"""Where a stream member's log ends, and where two logs stop agreeing: pure functions over offsets.

Owns `Tail` (osiris's "overview": the first offset kept, the next offset to write and the epoch offsets, i.e.
for each epoch present in the log the offset just past its last chunk), `agreed_next` (how far a replica's
log is a prefix of the writer's, `osiris_log:init_acceptor`'s question) and `tail_key`, the order in which
an election compares logs.

Rules (the replica protocol's, docs/streams.md "Replication"):
- A chunk is written by exactly one writer, the one of its epoch, and a writer appends at consecutive
  offsets; so two logs holding a chunk of the same epoch at the same offset hold the same chunk, and two
  logs that hold epoch `e` agree up to the smaller of their ends of `e` (provided they agree before it).
- Invariant: `Tail.epochs` is strictly increasing in epoch and non-decreasing in end offset, every end is
  at most `next`, and the last end equals `next` when the log is not empty.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Tail(NamedTuple):
    """A log's extent: `first` offset kept, `next` offset to write, `epochs` ((epoch, end offset), ...)."""

    first: int
    next: int
    epochs: tuple[tuple[int, int], ...]

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1][0] if self.epochs else 0

    def check(self) -> Tail:
        """The tail itself, after asserting its invariant (ValueError: a tail from a broken peer)."""
        if not 0 <= self.first <= self.next:
            raise ValueError(f"tail range {self.first}..{self.next} is backwards")
        prev_epoch, prev_end = -1, self.first
        for epoch, end in self.epochs:
            if epoch <= prev_epoch or end < prev_end or end > self.next:
                raise ValueError(f"tail epochs {self.epochs!r} out of order for next {self.next}")
            prev_epoch, prev_end = epoch, end
        if self.epochs and self.epochs[-1][1] != self.next:
            raise ValueError(f"tail epochs {self.epochs!r} do not end at next {self.next}")
        return self

    def clipped(self, next_offset: int) -> Tail:
        """The same log cut at `next_offset` (a chunk boundary at or below `next`): what survives a
        truncation there, or what was durable when `next_offset` is the synced end."""
        assert self.first <= next_offset <= self.next, (self, next_offset)
        kept: list[tuple[int, int]] = []
        start = self.first
        for epoch, end in self.epochs:
            if start >= next_offset:
                break
            kept.append((epoch, min(end, next_offset)))
            start = end
        return Tail(self.first, next_offset, tuple(kept))

    def trimmed(self, first: int) -> Tail:
        """The same log after retention removed everything before `first` (a chunk boundary at or below
        `next`): epochs that ended at or before it go."""
        assert self.first <= first <= self.next, (self, first)
        return Tail(first, self.next, tuple((e, end) for e, end in self.epochs if end > first))

    def appended(self, epoch: int, next_offset: int) -> Tail:
        """The log after appending a chunk of `epoch` that ends at `next_offset`."""
        assert next_offset > self.next and epoch >= self.last_epoch, (self, epoch, next_offset)
        if self.epochs and self.epochs[-1][0] == epoch:
            return Tail(self.first, next_offset, (*self.epochs[:-1], (epoch, next_offset)))
        return Tail(self.first, next_offset, (*self.epochs, (epoch, next_offset)))


EMPTY = Tail(0, 0, ())


def empty_at(offset: int) -> Tail:
    """An empty log whose next chunk will start at `offset` (a replica reset to the writer's first)."""
    return Tail(offset, offset, ())


def tail_key(tail: Tail) -> tuple[int, int]:
    """The election order: the log whose last chunk has the higher epoch, then the longer one. The
    member with the greatest key among a fenced majority holds every committed chunk (see the module
    docstring of stream_replica.py for the argument; the coordinator raises a log's epoch to that of
    a recorded epoch start it equals: stream_coordinator.election_key)."""
    return tail.last_epoch, tail.next


def same_log(tail: Tail, start: Tail) -> bool:
    """Whether a member's log `tail` is exactly the log `start` (a writer's log where its epoch began, as
    the coordinator recorded it): same end, same last epoch, and agreeing all the way (retention may have
    removed more of either's beginning: "unknown, not different", as in `agreed_next`). Two logs that
    agree up to an offset hold the same chunks there, so such a member holds every chunk `start` holds."""
    if tail.next != start.next or tail.last_epoch != start.last_epoch or bool(tail.epochs) != bool(start.epochs):
        return False
    return agreed_next(start, tail) == start.next


def agreed_next(writer: Tail, replica: Tail) -> int:
    """The end of the longest prefix of `replica`'s log that is also a prefix of `writer`'s log.

    The replica truncates there and the writer ships from there. The answer may lie below
    `writer.first` (the writer's retention removed what the replica lacks): the replica must then reset
    to an empty log at `writer.first` instead (`must_reset`)."""
    ends = dict(writer.epochs)
    agreed = replica.first
    for epoch, r_end in replica.epochs:
        w_end = ends.get(epoch)
        if w_end is None and r_end <= writer.first:
            # retention removed this epoch from the writer's files: unknown, not different. Chunks of a
            # later epoch that the writer holds vouch for it (the replica got them after agreeing with
            # that epoch's writer); if none does, `agreed` stays below `writer.first` and the replica
            # resets (the simulation's seed 7 on five members: an old writer's unconfirmed tail)
            continue
        if w_end is None:
            break  # the replica's chunks of this epoch come from a writer whose log lost them
        agreed = min(r_end, w_end)
        if r_end != w_end:
            break
    assert agreed <= min(writer.next, replica.next) or not replica.epochs
    return min(agreed, writer.next)


def must_reset(writer: Tail, replica: Tail, agreed: int) -> bool:
    """Whether the replica must throw its log away and start empty at the writer's first offset: it
    agrees on nothing the writer still has (all of it is below the writer's first offset), or its log
    starts past the writer's end."""
    if replica.first > writer.next:
        return True
    return agreed < writer.first or (not replica.epochs and replica.first < writer.first)


def tail_to_wire(tail: Tail) -> list[object]:
    """A tail as a msgpack-able value: [first, next, [[epoch, end], ...]]."""
    return [tail.first, tail.next, [list(e) for e in tail.epochs]]


def tail_from_wire(value: Any) -> Tail:  # Any: a msgpack value from a peer, checked here
    """The inverse of `tail_to_wire`; ValueError for anything that is not a well-formed tail."""
    try:
        first, nxt, epochs = value
        tail = Tail(int(first), int(nxt), tuple((int(e), int(end)) for e, end in epochs))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a stream tail: {value!r:.80}") from exc
    return tail.check()
