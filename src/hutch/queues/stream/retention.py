"""The retention rule of streams: which whole segments go (RabbitMQ's x-max-length-bytes and x-max-age).

Owns: `Retention` (the limits, from arguments and policies) and `segments_to_drop`, a pure function of the
segments' sizes and last timestamps.

Rules (osiris's `evaluate_retention`):
- Only whole segments are deleted, oldest first, and never the last (active) one.
- `max_bytes`: while the segments' total size is over it, the oldest goes.
- `max_age_ms`: a segment whose newest chunk is older than `now - max_age_ms` goes.
- Both may be set; a segment goes if either rule drops it. Neither set: nothing goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Retention:
    max_bytes: int | None = None
    max_age_ms: int | None = None

    @property
    def unlimited(self) -> bool:
        return self.max_bytes is None and self.max_age_ms is None


def segments_to_drop(segments: Sequence[tuple[int, int]], retention: Retention, now_ms: int) -> int:
    """How many of the oldest `segments` ((size in bytes, last chunk timestamp ms), oldest first) to
    delete. Never all of them: the last stays."""
    if len(segments) <= 1 or retention.unlimited:
        return 0
    drop = 0
    if retention.max_bytes is not None:
        total = sum(size for size, _ in segments)
        while drop < len(segments) - 1 and total > retention.max_bytes:
            total -= segments[drop][0]
            drop += 1
    if retention.max_age_ms is not None:
        horizon = now_ms - retention.max_age_ms
        aged = 0
        while aged < len(segments) - 1 and segments[aged][1] < horizon:
            aged += 1
        drop = max(drop, aged)
    assert 0 <= drop < len(segments)
    return drop
