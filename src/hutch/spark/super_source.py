"""Reading a super stream in Spark: every partition stream by offset, exactly-once, in parallel.

Owns: `HutchSuperStreamOffsetReader` (streaming) and `HutchSuperStreamBatchReader` (`spark.read`), the
driver's discovery of the partitions (`partition_streams`: the stream protocol's `partitions` command,
in partition order), the spreading of `maxOffsetsPerTrigger` over partitions (`cap_ends`) and the
planning of one micro-batch's ranges over tasks (`plan_partitions`).

Where the code runs: discovery, probes and planning on the driver (the partitions probed concurrently,
one thread each, at most MAX_PROBE_THREADS); `read` on executors, one range per
task through `stream_source.read_range` (the same reader as a plain stream, with the partition's
stream and index). A plain stream's rules hold per partition (stream_source.py): a planned end is never
past the end the driver probed, retention is checked per partition (`failOnDataLoss`).

Offsets: `{"superStream": <name>, "offsets": {"<partition index>": <next offset>}}` in Spark's
checkpoint, nothing on the broker. The partitions are taken once, when the reader is created; a
checkpoint with another number of partitions fails the query with a clear message (adding partitions
to a super stream is not followed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from .options import LATEST, Position, StreamReadOptions
from .pool import pooled
from .stream_source import (
    HutchStreamReadError,
    Probe,
    StreamRange,
    SupportsTriggerAvailableNow,
    admit,
    check_data_loss,
    read_range,
    split_range,
)
from .streamclient import StreamClientError

MAX_PROBE_THREADS = 16  # the driver's concurrent probes of one super stream


def partition_streams(opts: StreamReadOptions) -> list[str]:
    """The super stream's partition streams in partition order (driver; the stream protocol)."""
    name = opts.super_stream
    assert name is not None
    try:
        with pooled(opts.stream_uris(), f"hutch-spark partitions {name}",
                    opts.read_timeout_ms / 1000) as client:
            streams = client.partitions(name)
    except StreamClientError as exc:
        if exc.code == 0x02:  # STREAM_DOES_NOT_EXIST
            raise HutchStreamReadError(f"hutch source: super stream {name!r} does not exist in vhost "
                                       f"{opts.uri.vhost!r}") from None
        raise HutchStreamReadError(f"hutch source (super stream {name!r}): asking for its partitions over "
                                   f"the stream protocol (option 'streamPort'): {exc}") from None
    if not streams:
        raise HutchStreamReadError(f"hutch source: super stream {name!r} has no partitions")
    return streams


def each_partition(fn: Callable[[int], int], partitions: int) -> list[int]:
    """`fn(i)` for every partition index, the partitions probed at the same time (each probe is a
    connection and a wait: done one after the other they would add up per trigger)."""
    if partitions == 1:
        return [fn(0)]
    with ThreadPoolExecutor(max_workers=min(partitions, MAX_PROBE_THREADS)) as pool:
        return list(pool.map(fn, range(partitions)))


def cap_ends(starts: list[int], ends: list[int], max_rows: int) -> list[int]:
    """Ends that admit at most `max_rows` offsets in all, spread over the partitions in proportion to
    what each has available (Kafka's rule), and still moving when anything is available."""
    avail = [max(0, e - s) for s, e in zip(starts, ends, strict=True)]
    total = sum(avail)
    if total <= max_rows:
        return list(ends)
    take = [a * max_rows // total for a in avail]
    left = max_rows - sum(take)
    for i, a in enumerate(avail):
        if left <= 0:
            break
        extra = min(left, a - take[i])
        take[i] += extra
        left -= extra
    assert sum(take) <= max_rows and all(0 <= t <= a for t, a in zip(take, avail, strict=True))
    return [s + t for s, t in zip(starts, take, strict=True)]


def plan_partitions(ranges: list[tuple[int, str, int, int]], min_partitions: int) -> list[StreamRange]:
    """Tasks for (partition, stream, start, end) ranges: one per non-empty range, and when
    `min_partitions` asks for more, the large ranges split in proportion to their width."""
    live = [r for r in ranges if r[3] > r[2]]
    total = sum(e - s for _, _, s, e in live)
    out: list[StreamRange] = []
    for partition, stream, start, end in live:
        parts = 1
        if min_partitions > len(live):
            parts = max(1, math.ceil((end - start) * min_partitions / total))
        for s, e in split_range(start, end, parts):
            out.append(StreamRange(len(out), s, e, stream, partition))
    return out


class _SuperStream:
    """The driver's view of one super stream: its partitions and per-partition probes and positions."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts
        self.streams = partition_streams(opts)
        self.popts = [replace(opts, stream=s) for s in self.streams]

    def position(self, which: tuple[tuple[int, Position], ...], default: Position, i: int) -> Position:
        return dict(which).get(i, default)

    def ends(self) -> list[int]:
        return each_partition(lambda i: Probe(self.popts[i]).end() or 0, len(self.popts))

    def offsets_dict(self, offsets: list[int]) -> dict[str, Any]:
        return {"superStream": self.opts.super_stream,
                "offsets": {str(i): n for i, n in enumerate(offsets)}}

    def parse(self, d: dict[str, Any]) -> list[int]:
        offsets = d.get("offsets")
        if d.get("superStream") != self.opts.super_stream or not isinstance(offsets, dict) or \
                not all(isinstance(v, int) for v in offsets.values()):
            raise HutchStreamReadError(f"hutch source: the checkpoint's offset {d!r} is not an offset of "
                                       f"super stream {self.opts.super_stream!r}; use a new checkpointLocation")
        if sorted(offsets) != sorted(str(i) for i in range(len(self.streams))):
            raise HutchStreamReadError(
                f"hutch source: the checkpoint has offsets for {len(offsets)} partitions of super stream "
                f"{self.opts.super_stream!r}, which now has {len(self.streams)}; a query does not follow "
                "partitions added or removed: start it with a new checkpointLocation")
        return [int(offsets[str(i)]) for i in range(len(self.streams))]

    def plan(self, starts: list[int], ends: list[int]) -> list[StreamRange]:
        checked = each_partition(lambda i: check_data_loss(self.popts[i], starts[i], ends[i]), len(starts))
        ranges = [(i, self.streams[i], checked[i], ends[i]) for i in range(len(starts))]
        return plan_partitions(ranges, self.opts.min_partitions)


class HutchSuperStreamOffsetReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("hutch").option("superStream", ...)`: exactly-once micro-batches of
    per-partition offset ranges, read in parallel by the executors."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts
        self.ss = _SuperStream(opts)
        self._available_now_ends: list[int] | None = None
        self._last_ends: list[int] | None = None
        self._last_batch = time.monotonic()

    def initialOffset(self) -> dict[str, Any]:
        ss, opts = self.ss, self.opts
        starts = each_partition(lambda i: Probe(ss.popts[i]).resolve(
            ss.position(opts.starting_by_partition, opts.starting, i), empty=0), len(ss.popts))
        return ss.offsets_dict(starts)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_ends = self.ss.ends()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        ss, opts = self.ss, self.opts
        starts = ss.parse(start)
        ends = self._available_now_ends
        if ends is None:
            ends = self._last_ends = ss.ends()
        ends = [max(s, e) for s, e in zip(starts, ends, strict=True)]
        if isinstance(limit, ReadMaxRows):
            ends = cap_ends(starts, ends, limit.max_rows)
        available = sum(e - s for s, e in zip(starts, ends, strict=True))
        if self._available_now_ends is None and opts.min_offsets_per_trigger and \
                not admit(available, opts.min_offsets_per_trigger, opts.max_trigger_delay_ms,
                          (time.monotonic() - self._last_batch) * 1000):
            return ss.offsets_dict(starts)
        if available > 0:
            self._last_batch = time.monotonic()
        return ss.offsets_dict(ends)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        ends = self._last_ends
        return None if ends is None else self.ss.offsets_dict(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamRange]:
        return self.ss.plan(self.ss.parse(start), self.ss.parse(end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self.ss.parse(end)  # nothing to tell the broker: offsets live in Spark's checkpoint


class HutchSuperStreamBatchReader(DataSourceReader):
    """`spark.read.format("hutch").option("superStream", ...)`: each partition from its starting to its
    ending position, in at least one task per non-empty partition (`minPartitions` for more)."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[StreamRange]:
        ss = _SuperStream(self.opts)
        opts = self.opts
        starts, ends = [], []
        for i, o in enumerate(ss.popts):
            probe = Probe(o)
            latest = probe.end() or 0
            ending = ss.position(opts.ending_by_partition, opts.ending, i)
            end = latest if ending.kind == LATEST else min(probe.resolve(ending, empty=latest), latest)
            starts.append(probe.resolve(ss.position(opts.starting_by_partition, opts.starting, i), empty=end))
            ends.append(end)
        return ss.plan(starts, ends) or [StreamRange(0, 0, 0, ss.streams[0], 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return read_range(self.opts, partition)


__all__ = ["HutchSuperStreamBatchReader", "HutchSuperStreamOffsetReader", "cap_ends", "each_partition",
           "partition_streams", "plan_partitions"]
