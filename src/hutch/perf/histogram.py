"""The latency histogram: log-linear buckets in the style of HdrHistogram, fixed memory.

Owns: `LatencyHistogram`, which counts values (nanoseconds) in buckets whose width grows with the
value, so every bucket's relative width is at most 1/SUB_BUCKETS (under 0.8 %), and a percentile is
reported as the highest value its bucket holds (HdrHistogram's "highest equivalent value"), capped at the
largest value recorded.

Layout: values below 2*SUB_BUCKETS have a bucket each (exact). Above, a value v with
`shift = v.bit_length() - SUB_BITS - 1` lands in bucket `shift*SUB_BUCKETS + (v >> shift)`; the
mantissa `v >> shift` lies in [SUB_BUCKETS, 2*SUB_BUCKETS), so indices run on without gaps.

Invariant: `total == sum(counts)`; `min_value`/`max_value` are the exact extremes recorded (0 when empty).
Values past MAX_VALUE (about 18 minutes in ns) are clamped into the last bucket: memory is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable

SUB_BITS = 7
SUB_BUCKETS = 1 << SUB_BITS
MAX_VALUE = (1 << 40) - 1
BUCKET_COUNT = ((MAX_VALUE.bit_length() - SUB_BITS - 1) + 1) * SUB_BUCKETS + SUB_BUCKETS

# (index, count) pairs plus min and max: what crosses the pipe between processes once a second.
WireHistogram = tuple[list[tuple[int, int]], int, int]


def bucket_index(value: int) -> int:
    """The bucket a non-negative value falls in (values past MAX_VALUE share the last bucket)."""
    if value < 2 * SUB_BUCKETS:
        return value if value > 0 else 0
    if value > MAX_VALUE:
        value = MAX_VALUE
    shift = value.bit_length() - SUB_BITS - 1
    return shift * SUB_BUCKETS + (value >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The lowest and highest value that land in bucket `index`."""
    if index < 2 * SUB_BUCKETS:
        return index, index
    shift = index // SUB_BUCKETS - 1
    mantissa = index - shift * SUB_BUCKETS
    low = mantissa << shift
    return low, low + (1 << shift) - 1


class LatencyHistogram:
    """Counts of latency values in log-linear buckets; see the module docstring for the layout."""

    __slots__ = ("counts", "max_value", "min_value", "total")

    def __init__(self) -> None:
        self.counts = [0] * BUCKET_COUNT
        self.total = 0
        self.min_value = 0
        self.max_value = 0

    def record(self, value: int) -> None:
        self.record_many((value,))

    def record_many(self, values: Iterable[int]) -> None:
        """Record a batch (one call per received batch keeps the per-message cost to the loop body)."""
        counts = self.counts
        two_sub = 2 * SUB_BUCKETS
        low = self.min_value if self.total else MAX_VALUE
        high = self.max_value
        n = 0
        for v in values:
            if v < two_sub:
                if v < 0:
                    v = 0
                counts[v] += 1
            else:
                if v > MAX_VALUE:
                    v = MAX_VALUE
                shift = v.bit_length() - SUB_BITS - 1
                counts[shift * SUB_BUCKETS + (v >> shift)] += 1
            if v < low:
                low = v
            if v > high:
                high = v
            n += 1
        if n:
            self.total += n
            self.min_value = low
            self.max_value = high

    def value_at_percentile(self, percentile: float) -> int:
        """The highest value of the bucket holding the given percentile (0-100), capped at max_value."""
        if not self.total:
            return 0
        if percentile <= 0:
            return self.min_value
        # rank = ceil(percentile/100 * total), in integers so that 99.9 % of 1000 is exactly 999
        scaled = round(percentile * 1000) * self.total
        rank = max(1, -(-scaled // 100_000))
        seen = 0
        for index, count in enumerate(self.counts):
            if count:
                seen += count
                if seen >= rank:
                    return max(self.min_value, min(bucket_bounds(index)[1], self.max_value))
        return self.max_value

    def percentiles(self, *points: float) -> list[int]:
        return [self.value_at_percentile(p) for p in points]

    def merge(self, other: LatencyHistogram) -> None:
        self.merge_wire(other.to_wire())

    def to_wire(self) -> WireHistogram:
        return [(i, c) for i, c in enumerate(self.counts) if c], self.min_value, self.max_value

    def merge_wire(self, wire: WireHistogram) -> None:
        pairs, low, high = wire
        if not pairs:
            return
        counts = self.counts
        added = 0
        for index, count in pairs:
            counts[index] += count
            added += count
        self.min_value = low if not self.total else min(self.min_value, low)
        self.max_value = max(self.max_value, high)
        self.total += added

    def reset(self) -> None:
        self.counts = [0] * BUCKET_COUNT
        self.total = 0
        self.min_value = 0
        self.max_value = 0
