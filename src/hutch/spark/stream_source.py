"""Reading a hutch stream by offset in Spark: exactly-once micro-batches and parallel batch reads.

Owns: `HutchStreamOffsetReader` (a partitioned `DataSourceStreamReader` with admission control and
Trigger.AvailableNow), `HutchStreamBatchReader` (`spark.read` of an offset or time range), the range
planning (`split_range`; `admit` for minOffsetsPerTrigger/maxTriggerDelay), the driver's probes of a
stream (`Probe`: its first message, its exact committed end, the offset at a timestamp) and the read of
one range by an executor (`read_range`). Everything goes over the stream protocol (`streamPort`), on
connections kept per process (spark/pool.py); AMQP 0-9-1 only tells a missing stream from a queue of
another type in an error message (`_missing`).

Where the code runs:
- `initialOffset`, `latestOffset`, `partitions`, `commit`, `prepareForTriggerAvailableNow` of the
  streaming reader and `partitions` of the batch reader: on the driver. They only probe the stream
  (one-credit subscriptions that take one chunk's header) and plan offset ranges; no row passes through
  the driver.
- `read(partition)`: on an executor: a subscription at the range's start with a few chunks of credit,
  chunks as stored, their records decoded straight into Arrow columns, up to the chunk that holds
  end - 1, then unsubscribe (the connection stays in the executor's pool). Credit is all the broker
  hears; nothing is committed to it. Offsets live in Spark's checkpoint alone.

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

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from hutch.streamproto.codes import Code, OffsetType
from hutch.streamproto.wire import OffsetSpec

from .client import AmqpClient, ClientClosed
from .hosts import first_answering
from .options import EARLIEST, LATEST, OFFSET, TIMESTAMP, Position, StreamReadOptions
from .pool import pooled, pooled_on
from .records import batch_builder, describe
from .streamclient import MAX_CREDIT, StreamClient, StreamClientError

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # a PySpark without Trigger.AvailableNow for Python sources
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]  # a plain base in its place

log = logging.getLogger("hutch.spark")

ROWS_PER_RECORD_BATCH = 10_000  # a read task yields a record batch once it holds this many rows...
MAX_BATCH_BYTES = 64 * 1024 * 1024  # ...or this many bytes of bodies (then the chunk that passed it ends it)
CHUNK_RECORDS = 4096  # the most records in a chunk the broker cuts (a stream-protocol publisher's may hold more)
CHUNK_WAIT_S = 5.0  # a probe's wait for a chunk the stream's stats or its last chunk say is there


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


def on_member(stack: ExitStack, client: StreamClient, stream: str, name: str, timeout_s: float) -> StreamClient:
    """The connection to read `stream` on: `client` when its node holds the stream (its leader or a replica,
    as the `metadata` command names them), else a pooled one to the first member that answers; `client`
    when the broker places the stream nowhere (missing: the read's own error says so) or no member answers
    at its advertised address."""
    where = client.placement([stream]).get(stream)
    if where is None:
        return client
    return pooled_on(stack, client, where.members(), name, timeout_s) or client


def _missing(opts: StreamReadOptions) -> HutchStreamReadError:
    """The stream protocol answers STREAM_DOES_NOT_EXIST for a missing stream and for a queue of another
    type alike; one passive queue.declare over AMQP 0-9-1 (the only AMQP the stream source still speaks,
    on this error path alone) tells the user which."""
    try:
        with first_answering(opts.uris(), lambda uri: AmqpClient(uri, connection_name=f"hutch-spark check "
                                                                      f"{opts.stream}").connect(),
                             ClientClosed) as client:
            client.queue_message_count(opts.stream)
    except ClientClosed as exc:
        if exc.code != 404:
            return HutchStreamReadError(f"hutch source (stream {opts.stream!r}): {exc}")
        return HutchStreamReadError(f"hutch source: stream {opts.stream!r} does not exist in vhost "
                                    f"{opts.uri.vhost!r} on {opts.uri.display()}")
    return HutchStreamReadError(f"hutch source: {opts.stream!r} in vhost {opts.uri.vhost!r} is not a stream "
                                "(the 'stream' option reads streams by offset; use 'queue' for a queue)")


def explain(opts: StreamReadOptions, exc: StreamClientError, doing: str = "") -> HutchStreamReadError:
    if exc.code == Code.STREAM_DOES_NOT_EXIST:
        return _missing(opts)
    return HutchStreamReadError(f"hutch source (stream {opts.stream!r}): {doing}{exc}")


class Probe:
    """The driver's look at a stream over the stream protocol, on a kept connection (spark/pool.py: the
    source runner lives as long as the query, so a trigger's probes reuse the connections of the last):
    one-credit subscriptions that take one chunk's header, at `first`, `last` or a timestamp."""

    def __init__(self, opts: StreamReadOptions) -> None:
        self.opts = opts

    def _ask(self, what: Callable[[StreamClient], int | None]) -> int | None:
        opts = self.opts
        name, timeout_s = f"hutch-spark probe {opts.stream}", opts.read_timeout_ms / 1000
        try:
            with ExitStack() as stack:
                client = on_member(stack, stack.enter_context(pooled(opts.stream_uris(), name, timeout_s)),
                                   opts.stream, name, timeout_s)
                return what(client)
        except StreamClientError as exc:
            raise explain(opts, exc) from None

    def first(self) -> int | None:
        """The offset of the stream's first message (None: no message)."""
        return self._ask(lambda client: client.first_offset(self.opts.stream, CHUNK_WAIT_S))

    def end(self) -> int | None:
        """One past the offset of the stream's last committed message (None: no message), exactly
        (`StreamClient.committed_end`)."""
        return self._ask(lambda client: client.committed_end(self.opts.stream, CHUNK_WAIT_S))

    def at_timestamp(self, ms: int) -> int | None:
        """The offset of the first message of the first chunk written at or after `ms` (None: none yet).
        The last chunk's timestamp says whether there is one, so nothing is waited for in vain."""
        def ask(client: StreamClient) -> int | None:
            last = client.first_chunk(self.opts.stream, OffsetSpec(OffsetType.LAST), self.opts.poll_timeout_ms / 1000)
            if last is None or last.timestamp < ms:
                return None
            return client.offset_at(self.opts.stream, ms, CHUNK_WAIT_S)
        return self._ask(ask)

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


def credit_chunks(prefetch: int) -> int:
    """A read task's subscription credit in chunks for the `prefetch` option (messages): a chunk holds up
    to CHUNK_RECORDS of them when the broker cut it; at least 2 (one chunk decoded while the next comes),
    at most MAX_CREDIT."""
    return max(2, min(MAX_CREDIT, -(-prefetch // CHUNK_RECORDS)))


def read_range(opts: StreamReadOptions, part: StreamRange) -> Iterator[Any]:
    """Record batches of the messages with offsets in [start, end), in offset order. Runs on an executor:
    a subscription at offset `start` over the stream protocol (a kept connection of the process's pool)
    with `credit_chunks(prefetch)` chunks of credit, each chunk's records decoded straight into Arrow
    columns, until the chunk that holds end - 1; nothing acknowledged or stored on the broker."""
    start, end = part.start, part.end
    if start >= end:
        return
    if part.stream and part.stream != opts.stream:
        opts = replace(opts, stream=part.stream)
    timeout_s = opts.read_timeout_ms / 1000
    builder = batch_builder(opts.stream, part.partition, opts.include_headers)
    _say_which_decoder()
    seen = start - 1
    try:
        with ExitStack() as stack:
            name = f"hutch-spark read {opts.stream}"
            client = on_member(stack, stack.enter_context(pooled(opts.stream_uris(), name, timeout_s)), opts.stream,
                               name, timeout_s)
            first = True
            for header in client.read_range(opts.stream, start, end, credit_chunks(opts.prefetch), timeout_s):
                if first and header.chunk_id > start:
                    # The range does not start where planned: retention removed offsets since the driver
                    # planned it (or they hold no message); failOnDataLoss decides, as on the driver.
                    check_data_loss(opts, start, end)
                first = False
                seen = header.next_offset - 1
                builder.add_chunk(client.last_chunk, start, end)
                if builder.rows >= ROWS_PER_RECORD_BATCH or builder.nbytes >= MAX_BATCH_BYTES:
                    yield builder.flush()
        if builder.rows:
            yield builder.flush()
    except StreamClientError as exc:
        raise explain(opts, exc, f"reading offsets [{start}, {end}) (read up to {seen}): ") from None
    except ValueError as exc:  # a chunk whose entries do not parse
        raise HutchStreamReadError(f"hutch source (stream {opts.stream!r}): reading offsets [{start}, {end}): "
                                   f"bad chunk: {exc}") from None


_said: list[bool] = []


def _say_which_decoder() -> None:
    """Log once per Python worker which chunk decoder its read tasks run (records.describe)."""
    if not _said:
        _said.append(True)
        log.info("hutch source: %s", describe())


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
