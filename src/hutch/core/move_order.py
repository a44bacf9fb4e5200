"""Order across a queue's move between workers: the new home's wait for the other workers' markers.

Owns: `MarkerWait`, the pure bookkeeping of one queue moving from worker A (`via`) to worker B (compaction
of load, runtime/compaction.py; docs/scaling.md "Compaction of load: status"). Every other worker C (of
this node or of another node of the cluster) may have publishes to the queue on their way to A when it
applies the record naming B; A forwards (or relays) them to B. C's later publishes go straight to B. So
that they do not overtake the earlier ones, C, as it applies the record, sends A a marker behind its last
publish there (`QueueMoved`), and A forwards it to B behind everything of C's it held or relayed. B keeps
C's direct publishes (`hold`) until C's marker has come and B has the queue (`install`), then takes them
in the order they came.

Rules:
- An origin is waited for only if it was expected when the wait began (every worker connected to B but A
  and B, at the moment B asked to commit: no worker can apply the record before that); a marker of any
  other origin, or a second one, releases nothing.
- Nothing is released before `install` (the queue is not B's yet); a marker that came before is kept.
- Never forever: when A goes down (`peer_down(via)`) every origin is let go (what was in flight through A
  is lost with A, and nacked to its publishers by their workers), and at `expire` (the bound, the
  runtime's `MARKER_WAIT_S`) whatever still waits. An origin that goes down with nothing held is let go
  (a restarted worker has nothing in flight); one with publishes held keeps waiting, because it sent its
  marker before its first direct publish (to A, or to B itself when A was unreachable for it), so the
  marker is on its way.
- Each held item is released exactly once, in the order it was held, with its origin's other items.

Invariants: `held` holds exactly the origins not yet released; `marked` is a subset of `held`'s keys.
Pure: no IO, no clock (the runtime owns the timer).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class MarkerWait(Generic[T]):
    """B's wait for the markers of the origins expected when a queue moves here from `via`."""

    def __init__(self, via: str, origins: Iterable[str]) -> None:
        self.via = via
        self.held: dict[str, list[T]] = {o: [] for o in origins if o != via}
        self.marked: set[str] = set()
        self.installed = False

    def holds(self, origin: str) -> list[T] | None:
        """Where `origin`'s direct publishes wait (append to it), or None if they need not wait."""
        return self.held.get(origin)

    def marker(self, origin: str) -> list[tuple[str, list[T]]]:
        """`origin`'s marker came (through `via`, or from `origin` itself when `via` was unreachable for it):
        what may be taken now (nothing before `install`: the marker is kept)."""
        if origin not in self.held:
            return []
        if not self.installed:
            self.marked.add(origin)
            return []
        return self._release([origin])

    def install(self) -> list[tuple[str, list[T]]]:
        """B has the queue: the origins whose marker came already are released."""
        assert not self.installed, "installed twice"
        self.installed = True
        return self._release([o for o in self.held if o in self.marked])

    def peer_down(self, peer: str) -> list[tuple[str, list[T]]]:
        """`peer`'s link to B went down. `via`: nothing more comes through it, every origin is let go. An
        origin with nothing held: let go (nothing of it is in flight). Before `install`, kept as a marker."""
        if peer == self.via:
            origins = list(self.held)
        elif peer in self.held and not self.held[peer]:
            origins = [peer]
        else:
            return []
        if not self.installed:
            self.marked.update(origins)
            return []
        return self._release(origins)

    def expire(self) -> list[tuple[str, list[T]]]:
        """The bound passed: every origin still waited for is released (order given up for availability)."""
        return self._release(list(self.held))

    def abandon(self) -> list[tuple[str, list[T]]]:
        """The move did not end here: everything held, to be handled as if it had just come."""
        return self._release(list(self.held))

    @property
    def done(self) -> bool:
        return not self.held

    def _release(self, origins: list[str]) -> list[tuple[str, list[T]]]:
        out = [(o, self.held.pop(o)) for o in origins if o in self.held]
        self.marked.difference_update(o for o, _items in out)
        assert self.marked <= self.held.keys()
        return out
