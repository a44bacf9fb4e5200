"""Reading a hutch stream by offset in Spark: exactly-once micro-batches and parallel batch reads.

Owns: `HutchStreamOffsetReader` (a partitioned `DataSourceStreamReader` with admission control and
Trigger.AvailableNow), `HutchStreamBatchReader` (`spark.read` of an offset or time range), the range
planning (`split_range`; `admit` for minOffsetsPerTrigger/maxTriggerDelay), the driver's probes of a
stream (`Probe`: its first message, its exact committed end through the stream protocol, the offset at a
timestamp) and the read of one range by an
executor (`read_range`).

Where the code runs:
- `initialOffset`, `latestOffset`, `partitions`, `commit`, `prepareForTriggerAvailableNow` of the
  streaming reader and `partitions` of the batch reader: on the driver. They only probe the stream (a
  consumer that reads one message, or the last chunk's messages) and plan offset ranges; no row passes
  through the driver.
- `read(partition)`: on an executor, one AMQP connection per range: basic.consume with
  `x-stream-offset` = the range's start, emit the messages whose offset is in [start, end), stop at the
  first delivery at or past end - 1, close. Acknowledgements are only credit (a stream keeps every
  message); nothing is committed to the broker. Offsets live in Spark's checkpoint alone.

Rules:
- An offset dict is `{"stream": <name>, "offset": <n>}`: the next offset to read (exclusive end of the
  batch before). A planned end `e` is always one past an offset at which the driver saw a message (or
  the start itself), so the reader of a range [s, e) is sure to get a delivery at or past e - 1 and
  stops without guessing from a timeout (offsets the stream uses for its own tracking entries carry no
  message; a range may hold fewer messages than its width).
- Data loss: a range whose start is below the stream's first message (retention removed segments)
  fails the batch with `failOnDataLoss=true`, else is read from the first message with a warning.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from hutch.streamproto.codes import Code

from .client import AmqpClient, ClientClosed
from .options import EARLIEST, LATEST, OFFSET, TIMESTAMP, Position, StreamReadOptions
from .schema import stream_offset, to_stream_record_batch
from .streamclient import StreamClient, StreamClientError

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # a PySpark without Trigger.AvailableNow for Python sources
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]  # a plain base in its place

log = logging.getLogger("hutch.spark")

ROWS_PER_RECORD_BATCH = 10_000
PROBE_PREFETCH = 4096  # the last chunk's messages come at most this many at a time (acks are credit)
END_CHUNK_WAIT_S = 5.0  # the end probe's wait for the last chunk (it has one: the stream's stats said so)


class HutchStreamReadError(RuntimeError):
    """Reading a stream failed (stream missing, connection lost, data lost to retention...)."""


def stream_offset_dict(stream: str, n: int) -> dict[str, Any]:
    return {"stream": stream, "offset": n}


def split_range(start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) as at most `parts` contiguous, non-empty, near-equal ranges, in order."""
    width = end - start
    if width <= 0:
        return []
    parts = max(1, min(parts, width))
    base, extra = divmod(width, parts)
    out, s = [], start
    for i in range(parts):
        e = s + base + (1 if i < extra else 0)
        out.append((s, e))
        s = e
    return out


def admit(available: int, min_offsets: int, max_delay_ms: int, waited_ms: float) -> bool:
    """minOffsetsPerTrigger / maxTriggerDelay (Kafka's): plan a batch of `available` offsets now, or wait
    for more? A batch below the minimum runs once `max_delay_ms` has passed since the last batch."""
    if available <= 0:
        return False
    return available >= min_offsets or waited_ms >= max_delay_ms


def _connect(opts: StreamReadOptions, name: str) -> AmqpClient:
    try:
        return AmqpClient(opts.uri, connection_name=name).connect()
    except ClientClosed as exc:
        raise HutchStreamReadError(f"hutch source (stream {opts.stream!r}): {exc}") from None


def _consume(client: AmqpClient, opts: StreamReadOptions, prefetch: int, at: Any) -> None:
    try:
        client.consume(opts.stream, prefetch, {"x-stream-offset": at})
    except ClientClosed as exc:
        client.close()
        if exc.code == 404:
            raise HutchStreamReadError(f"hutch source: stream {opts.stream!r} does not exist in vhost "
                                       f"{opts.uri.vhost!r} on {opts.uri.display()}") from None
        if exc.code in (406, 540):
            raise HutchStreamReadError(f"hutch source: {opts.stream!r} in vhost {opts.uri.vhost!r} is not a "
                                       f"stream (the 'stream' option reads streams; use 'queue' for a "
                                       f"queue): {exc}") from None
        raise HutchStreamReadError(f"hutch source (stream {opts.stream!r}): {exc}") from None


class Probe:
    """The driver's look at a stream: short-lived consumers that read one message, or the last chunk."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts

    def _offsets(self, at: Any, prefetch: int, whole_chunk: bool) -> list[int]:
        opts = self.opts
        client = _connect(opts, f"hutch-spark probe {opts.stream}")
        try:
            _consume(client, opts, prefetch, at)
            wait = opts.poll_timeout_ms / 1000
            got = client.take_available(prefetch, wait)
            if not got:
                self._check_is_stream()
                return []
            out = [self._offset_of(d) for d in got]
            while whole_chunk:
                # The last chunk's messages come in a burst; stopping early only plans less now.
                client.ack(got[-1].delivery_tag)
                got = client.take(prefetch, min(wait, 0.05), idle=True)
                if not got:
                    break
                out.extend(self._offset_of(d) for d in got)
            return out
        except ClientClosed as exc:
            raise HutchStreamReadError(f"hutch source (stream {opts.stream!r}): {exc}") from None
        finally:
            client.close()

    def _not_a_stream(self) -> HutchStreamReadError:
        opts = self.opts
        return HutchStreamReadError(f"hutch source: {opts.stream!r} in vhost {opts.uri.vhost!r} is not a stream "
                                    "(the 'stream' option reads streams by offset; use 'queue' for a queue)")

    def _offset_of(self, d: Any) -> int:
        try:
            return stream_offset(d)[0]
        except ValueError:
            raise self._not_a_stream() from None  # a queue's message: it goes back (redelivered)

    def _check_is_stream(self) -> None:
        """Nothing came: an empty stream, or an empty queue (whose basic.get answers get-empty)."""
        client = _connect(self.opts, f"hutch-spark stream check {self.opts.stream}")
        try:
            stream = client.is_stream(self.opts.stream)
        except ClientClosed as exc:
            raise HutchStreamReadError(f"hutch source (stream {self.opts.stream!r}): {exc}") from None
        finally:
            client.close()
        if not stream:
            raise self._not_a_stream()

    def first(self) -> int | None:
        """The offset of the stream's first message (None: no message)."""
        found = self._offsets("first", 1, False)
        return found[0] if found else None

    def end(self) -> int | None:
        """One past the offset of the stream's last committed message (None: no message). Exact through
        the stream protocol (`StreamClient.committed_end`); a broker without the stream listener (or
        without StreamStats) gets the AMQP probe, which may stop short in the last chunk under load."""
        opts = self.opts
        client = StreamClient(replace(opts.uri, port=opts.stream_port), f"hutch-spark end {opts.stream}",
                              timeout_s=opts.read_timeout_ms / 1000)
        try:
            client.connect()
        except StreamClientError as exc:
            log.warning("hutch source (stream %r): the end probe falls back to AMQP, which can stop short of "
                        "the end under load: %s", opts.stream, exc)
            return self._amqp_end()
        try:
            return client.committed_end(opts.stream, max(opts.poll_timeout_ms / 1000, END_CHUNK_WAIT_S))
        except StreamClientError as exc:
            # a missing stream or a refusal: the AMQP path names the error as the rest of the source does
            if exc.code not in (Code.STREAM_DOES_NOT_EXIST, Code.ACCESS_REFUSED):
                    log.warning("hutch source (stream %r): the exact end probe failed (%s); probing over AMQP",
                            opts.stream, exc)
            return self._amqp_end()
        finally:
            client.close()

    def _amqp_end(self) -> int | None:
        found = self._offsets("last", PROBE_PREFETCH, True)
        return max(found) + 1 if found else None

    def at_timestamp(self, ms: int) -> int | None:
        """The offset of the first message of the chunk written at or after `ms` (None: none yet)."""
        at = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
        found = self._offsets(at, 1, False)
        return found[0] if found else None

    def resolve(self, pos: Position, *, empty: int) -> int:
        """An offset for `pos`; `empty` when the position names no message yet."""
        if pos.kind == OFFSET:
            return pos.value
        if pos.kind == EARLIEST:
            first = self.first()
            return empty if first is None else first
        if pos.kind == LATEST:
            end = self.end()
            return empty if end is None else end
        assert pos.kind == TIMESTAMP
        found = self.at_timestamp(pos.value)
        if found is not None:
            return found
        end = self.end()
        return empty if end is None else end


def check_data_loss(opts: StreamReadOptions, start: int, end: int) -> int:
    """The start to read [start, end) from: `start`, or the stream's first message if retention removed
    offsets from `start` on (failOnDataLoss=true: an error instead)."""
    if start >= end:
        return start
    first = Probe(opts).first()
    if first is None or first <= start:
        return start
    text = (f"hutch source (stream {opts.stream!r}): offsets {start} to {min(first, end) - 1} are no longer "
            f"in the stream (retention removed them; its first message is at offset {first})")
    if opts.fail_on_data_loss:
        raise HutchStreamReadError(text + "; set failOnDataLoss=false to skip them with a warning")
    log.warning("%s; skipped (failOnDataLoss=false)", text)
    return min(first, end)


class StreamRange(InputPartition):
    """One read task: the messages with offsets in [start, end) of `stream` ("": the options' stream),
    which is partition `partition` of a super stream (0 for a plain stream)."""

    def __init__(self, index: int, start: int, end: int, stream: str = "", partition: int = 0) -> None:
        super().__init__(index)
        self.index = index
        self.start = start
        self.end = end
        self.stream = stream
        self.partition = partition


def plan(opts: StreamReadOptions, start: int, end: int) -> list[StreamRange]:
    start = check_data_loss(opts, start, end)
    return [StreamRange(i, s, e) for i, (s, e) in enumerate(split_range(start, end, opts.min_partitions))]


def read_range(opts: StreamReadOptions, part: StreamRange) -> Iterator[Any]:
    """Record batches of the messages with offsets in [start, end), in offset order. Runs on an executor."""
    start, end = part.start, part.end
    if start >= end:
        return
    if part.stream and part.stream != opts.stream:
        opts = replace(opts, stream=part.stream)
    client = _connect(opts, f"hutch-spark stream read {opts.stream} [{start},{end})")
    try:
        _consume(client, opts, min(opts.prefetch, end - start), start)
        rows: list[Any] = []
        cache: dict[bytes, Any] = {}
        last_seen = start - 1
        timeout_s = opts.read_timeout_ms / 1000
        while last_seen < end - 1:
            began = time.monotonic()
            try:
                got = client.take_available(ROWS_PER_RECORD_BATCH, timeout_s)
            except ClientClosed as exc:
                raise HutchStreamReadError(f"hutch source (stream {opts.stream!r}): reading offsets "
                                           f"[{start}, {end}): {exc}") from None
            if not got:
                raise HutchStreamReadError(
                    f"hutch source (stream {opts.stream!r}): no message arrived for "
                    f"{time.monotonic() - began:.0f} s while reading offsets [{start}, {end}) (last seen: "
                    f"{last_seen}); is the node overloaded? (readTimeoutMs={opts.read_timeout_ms})")
            client.ack(got[-1].delivery_tag)  # credit: a stream keeps its messages
            if last_seen < start and stream_offset(got[0], cache)[0] > start:
                # The range does not start where planned: retention removed offsets since the driver
                # planned it (or they hold no message); failOnDataLoss decides, as on the driver.
                check_data_loss(opts, start, end)
            for d in got:
                off, props = stream_offset(d, cache)
                last_seen = max(last_seen, off)
                if start <= off < end:
                    rows.append((off, props, d))
            if len(rows) >= ROWS_PER_RECORD_BATCH:
                yield to_stream_record_batch(rows, opts.stream, opts.include_headers, part.partition)
                rows = []
        if rows:
            yield to_stream_record_batch(rows, opts.stream, opts.include_headers, part.partition)
    finally:
        client.close()


class HutchStreamOffsetReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("hutch").option("stream", ...)`: exactly-once micro-batches of offset
    ranges, read in parallel by the executors."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts
        self._available_now_end: int | None = None
        self._last_end: int | None = None  # the last probed end, for Spark's query status
        self._last_batch = time.monotonic()  # when the last batch was planned (maxTriggerDelay)

    def _offset(self, d: dict[str, Any]) -> int:
        if d.get("stream") != self.opts.stream or not isinstance(d.get("offset"), int):
            raise HutchStreamReadError(f"hutch source: the checkpoint's offset {d!r} is not an offset of "
                                       f"stream {self.opts.stream!r}; use a new checkpointLocation")
        return int(d["offset"])

    def initialOffset(self) -> dict[str, Any]:
        start = Probe(self.opts).resolve(self.opts.starting, empty=0)
        return stream_offset_dict(self.opts.stream, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_end = Probe(self.opts).end() or 0

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        s = self._offset(start)
        end = self._available_now_end
        if end is None:
            end = self._last_end = Probe(self.opts).end() or 0
        if isinstance(limit, ReadMaxRows):
            end = min(end, s + limit.max_rows)
        opts = self.opts
        if self._available_now_end is None and opts.min_offsets_per_trigger and \
                not admit(end - s, opts.min_offsets_per_trigger, opts.max_trigger_delay_ms,
                          (time.monotonic() - self._last_batch) * 1000):
            return stream_offset_dict(opts.stream, s)  # wait for more (or for maxTriggerDelay)
        if end > s:
            self._last_batch = time.monotonic()
        return stream_offset_dict(opts.stream, max(s, end))

    def reportLatestOffset(self) -> dict[str, Any] | None:
        end = self._last_end  # probed by latestOffset in this trigger: no second probe
        return None if end is None else stream_offset_dict(self.opts.stream, end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[StreamRange]:
        return plan(self.opts, self._offset(start), self._offset(end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return read_range(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        # Nothing to tell the broker: the offset is in Spark's checkpoint, and a stream keeps its messages.
        self._offset(end)


class HutchStreamBatchReader(DataSourceReader):
    """`spark.read.format("hutch").option("stream", ...)`: the messages from startingOffsets (or
    startingTimestamp) to endingOffsets (or endingTimestamp), read in `minPartitions` parallel tasks."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[StreamRange]:
        probe = Probe(self.opts)
        latest = probe.end() or 0
        # Never past the last message (a range's reader waits for a message at or past its end - 1).
        end = latest if self.opts.ending.kind == LATEST else min(probe.resolve(self.opts.ending, empty=latest),
                                                                 latest)
        start = probe.resolve(self.opts.starting, empty=end)
        parts = plan(self.opts, start, end)
        return parts or [StreamRange(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, StreamRange)
        return read_range(self.opts, partition)
