"""Reading from hutch in Spark: the batch reader (`spark.read`) and the streaming reader (`readStream`).

Owns: `HutchBatchReader` + `HutchPartition` and `HutchStreamReader` (a `SimpleDataSourceStreamReader`
with Trigger.AvailableNow support).

Where the code runs (PySpark 4.2+/4.3):
- `HutchStreamReader.initialOffset/read/commit/stop/prepareForTriggerAvailableNow` run on the driver,
  in the one long-lived Python process Spark keeps per streaming source (the "source runner"). That
  process holds the AMQP connection, so the process that receives a delivery is the one that
  acknowledges it. Rows of a batch read by `read()` go from there to the JVM as Arrow record batches.
- `HutchStreamReader.readBetweenOffsets` runs on an executor, in a fresh unpickled copy: Spark calls it
  only to replay a batch whose rows the driver does not hold - after a restart, for the batch that was
  planned but not committed. A queue cannot be re-read, so it returns no rows: the messages of that
  batch were unacknowledged when the old query's connection closed, so the broker requeued them and
  they arrive again (redelivered=true) in a later batch. See docs/spark.md, "Delivery guarantees".
- `HutchBatchReader.partitions` runs on the driver (a planner process); `HutchBatchReader.read` runs
  on executors, one AMQP connection per partition.

Rules:
- Connections are opened lazily (never in `__init__`): Spark builds reader objects in short-lived
  planner processes only to pickle them, and a reader must stay picklable.
- Acknowledgements follow `ledger.Ledger`: a streaming delivery is acknowledged only after Spark has
  finished the micro-batch holding it and only if its rows were emitted to Spark.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition, SimpleDataSourceStreamReader

from .client import AmqpClient, ClientClosed
from .hosts import first_answering
from .ledger import Ledger, LedgerError
from .options import HutchOptionError, ReadOptions
from .schema import to_record_batch

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # a PySpark without Trigger.AvailableNow for Python sources: Spark wraps the source
    SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]  # a plain base in its place

log = logging.getLogger("hutch.spark")

ROWS_PER_RECORD_BATCH = 10_000


class HutchReadError(RuntimeError):
    """Reading from the broker failed (connection lost, queue missing, channel closed...)."""


def open_client(opts: ReadOptions, name: str) -> AmqpClient:
    try:
        return first_answering(opts.uris(), lambda uri: AmqpClient(uri, connection_name=name).connect(),
                               ClientClosed)
    except ClientClosed as exc:
        raise HutchReadError(f"hutch source (queue {opts.queue!r}): {exc}") from None


def _count_ready(client: AmqpClient, opts: ReadOptions) -> int:
    try:
        return client.queue_message_count(opts.queue)
    except ClientClosed as exc:
        client.close()
        if exc.code == 404:
            raise HutchReadError(f"hutch source: queue {opts.queue!r} does not exist in vhost "
                                 f"{opts.uri.vhost!r} on {opts.uri.display()}") from None
        raise HutchReadError(f"hutch source (queue {opts.queue!r}): {exc}") from None


def refuse_stream(opts: ReadOptions, ready: int) -> None:
    """Fail clearly when the queue is a stream: the source consumes and acknowledges, which on a stream
    would read only what is published after it starts (docs/spark.md, docs/streams.md). A stream says 0
    ready messages (as RabbitMQ's do), so only a queue that says 0 is probed: its basic.get answers
    get-empty and changes nothing."""
    if ready:
        return
    probe = open_client(opts, "hutch-spark stream check")
    try:
        stream = probe.is_stream(opts.queue)
    except ClientClosed as exc:
        raise HutchReadError(f"hutch source (queue {opts.queue!r}): {exc}") from None
    finally:
        probe.close()
    if stream:
        raise HutchReadError(f"hutch source: queue {opts.queue!r} in vhost {opts.uri.vhost!r} is a stream; the "
                             "'queue' option consumes queues: read a stream by offset with "
                             f".option('stream', {opts.queue!r}) instead (see docs/spark.md)")


# -- batch ---------------------------------------------------------------------------------------------


class HutchPartition(InputPartition):
    """One read task: consume at most `quota` messages."""

    def __init__(self, index: int, quota: int) -> None:
        super().__init__(index)
        self.index = index
        self.quota = quota


class HutchBatchReader(DataSourceReader):
    """`spark.read.format("hutch")`: drain up to `maxMessages` of the messages ready at planning time.

    Acknowledgement (ackMode=afterPartition): a read task holds its messages unacknowledged while it
    emits them and acknowledges them all (one basic.ack, multiple=true) when Spark asks it for more
    after the partition's last record batch. A task that fails or is killed before that point closes
    its connection and the broker requeues its messages (redelivered=true), so Spark's task retry sees
    them again. After that point the messages are gone from the queue even if a later stage or the
    job fails. ackMode=none never acknowledges: a non-destructive look at the queue (the messages are
    requeued, marked redelivered, when the task ends).
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[HutchPartition]:
        opts = self.opts
        client = open_client(opts, "hutch-spark batch planner")
        try:
            ready = _count_ready(client, opts)
        finally:
            client.close()
        refuse_stream(opts, ready)
        total = min(opts.max_messages, ready)
        n = opts.num_partitions or max(1, math.ceil(total / opts.prefetch))
        if total > n * opts.prefetch:
            raise HutchOptionError(
                f"hutch source: {total} messages to read with numPartitions={n} needs more than 'prefetch' "
                f"({opts.prefetch}) per partition; a read task holds its messages unacknowledged until it "
                "has emitted them all, so raise numPartitions (or leave it unset) or lower maxMessages")
        base, extra = divmod(total, n)
        return [HutchPartition(i, base + (1 if i < extra else 0)) for i in range(n)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, HutchPartition)
        opts = self.opts
        quota = partition.quota
        if quota <= 0:
            return
        client = open_client(opts, f"hutch-spark batch read {partition.index}")
        acked = False
        try:
            try:
                client.consume(opts.queue, min(opts.prefetch, quota))
            except ClientClosed as exc:
                raise HutchReadError(f"hutch source: cannot consume from queue {opts.queue!r}: {exc}") from None
            got = 0
            last_tag = 0
            idle_s = opts.poll_timeout_ms / 1000
            while got < quota:
                try:
                    chunk = client.take(min(ROWS_PER_RECORD_BATCH, quota - got), idle_s, idle=True)
                except ClientClosed as exc:
                    raise HutchReadError(f"hutch source (queue {opts.queue!r}): {exc}") from None
                if not chunk:
                    break
                got += len(chunk)
                last_tag = chunk[-1].delivery_tag
                yield to_record_batch(chunk, opts.queue, opts.include_headers)
            # Spark asked for more after the last record batch: every row of this partition is with
            # Spark's worker. Only now is acknowledging safe against a failure of this task.
            if last_tag and opts.ack_mode == "afterPartition":
                try:
                    client.ack(last_tag, multiple=True)  # processed before the connection.close
                    acked = True
                except ClientClosed as exc:
                    raise HutchReadError(f"hutch source (queue {opts.queue!r}): acknowledging {got} "
                                         f"messages failed, they will be redelivered: {exc}") from None
        finally:
            client.close()
            if not acked:
                log.debug("hutch batch read %d: closed without acknowledging", partition.index)


# -- streaming -----------------------------------------------------------------------------------------


def offset(queue: str, seq: int) -> dict[str, Any]:
    """The JSON offset of a hutch stream: deterministic key order, primitives only."""
    return {"queue": queue, "seq": seq}


class _EmittingBatches:
    """The rows of one micro-batch as record batches; when Spark has read them all, the ledger learns
    that the batch (start, end] was emitted. Copyable (Spark copies cached iterators before use)."""

    def __init__(self, batches: list[Any], on_emitted: Any, pos: int = 0) -> None:
        self._batches = batches
        self._on_emitted = on_emitted
        self._pos = pos

    def __iter__(self) -> _EmittingBatches:
        return self

    def __next__(self) -> Any:
        if self._pos < len(self._batches):
            self._pos += 1
            return self._batches[self._pos - 1]
        if self._on_emitted is not None:
            self._on_emitted()
        raise StopIteration

    def __copy__(self) -> _EmittingBatches:
        return _EmittingBatches(self._batches, self._on_emitted, self._pos)


class HutchStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("hutch")`: at-least-once micro-batches from one queue."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._client: AmqpClient | None = None
        self._consuming = False
        self._ledger: Ledger | None = None
        self._available_now_left: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_client": None, "_consuming": False, "_ledger": None,
                "_available_now_left": None}

    # -- connection --

    def _connected(self) -> AmqpClient:
        client = self._client
        if client is None:
            client = self._client = open_client(self.opts, f"hutch-spark stream {self.opts.queue}")
            ready = _count_ready(client, self.opts)  # fails clearly when the queue does not exist
            refuse_stream(self.opts, ready)
        elif client.failure is not None:
            raise HutchReadError(f"hutch source (queue {self.opts.queue!r}): {client.failure}; the "
                                 "messages of unfinished batches were requeued by the broker, restart the "
                                 "query from its checkpoint")
        return client

    def _consumer(self) -> AmqpClient:
        client = self._connected()
        if not self._consuming:
            try:
                client.consume(self.opts.queue, self.opts.prefetch)
            except ClientClosed as exc:
                raise HutchReadError(f"hutch source: cannot consume from queue {self.opts.queue!r}: "
                                     f"{exc}") from None
            self._consuming = True
        return client

    def _seq(self, off: dict[str, Any]) -> int:
        queue = off.get("queue")
        seq = off.get("seq")
        if queue != self.opts.queue or not isinstance(seq, int):
            raise HutchOptionError(
                f"hutch source: the checkpoint holds offset {off!r}, written by a query that read queue "
                f"{queue!r}; this query reads {self.opts.queue!r}. Use a new checkpoint location to read "
                "another queue")
        return seq

    def _settle(self, upto_seq: int) -> None:
        ledger = self._ledger
        if ledger is None:
            self._ledger = Ledger(upto_seq)
            return
        for s in ledger.settle(upto_seq):
            client = self._connected()
            try:
                if s.ack:
                    client.ack(s.delivery_tag, multiple=True)
                else:
                    log.warning("hutch source: %d messages were handed to Spark but never emitted; "
                                "requeueing them", s.count)
                    client.requeue(s.delivery_tag, multiple=True)
            except ClientClosed as exc:
                raise HutchReadError(f"hutch source (queue {self.opts.queue!r}): settling {s.count} "
                                     f"messages failed: {exc}") from None

    # -- SimpleDataSourceStreamReader --

    def initialOffset(self) -> dict[str, Any]:
        self._connected()
        return offset(self.opts.queue, 0)

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow: read what is ready now, then let the query finish.
        self._available_now_left = _count_ready(self._connected(), self.opts)

    def read(self, start: dict[str, Any]) -> tuple[Iterator[Any], dict[str, Any]]:
        opts = self.opts
        start_seq = self._seq(start)
        # Spark asks for the next batch only after the previous one finished (sink written, commit
        # log entry made): settle everything up to `start`.
        self._settle(start_seq)
        ledger = self._ledger
        assert ledger is not None
        limit = opts.max_messages_per_trigger
        want = ledger.room(start_seq, limit)
        if self._available_now_left is not None:
            want = min(want, self._available_now_left)
        if want > 0:
            client = self._consumer()
            try:
                new = client.take(want, opts.poll_timeout_ms / 1000)
            except ClientClosed as exc:
                raise HutchReadError(f"hutch source (queue {opts.queue!r}): {exc}; the messages of "
                                     "unfinished batches were requeued by the broker, restart the query "
                                     "from its checkpoint") from None
            if self._available_now_left is not None:
                self._available_now_left -= len(new)
            ledger.append((d.delivery_tag, d) for d in new)
        try:
            items, end_seq = ledger.batch(start_seq, limit)
        except LedgerError as exc:
            raise HutchReadError(f"hutch source: {exc}") from None
        if not items:
            return iter(()), start
        batches = [to_record_batch(items[i:i + ROWS_PER_RECORD_BATCH], opts.queue, opts.include_headers)
                   for i in range(0, len(items), ROWS_PER_RECORD_BATCH)]

        def emitted() -> None:
            if self._ledger is ledger:
                ledger.mark_emitted(start_seq, end_seq)

        return _EmittingBatches(batches, emitted), offset(opts.queue, end_seq)

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[Any]:
        # Runs on an executor, in a fresh copy of this reader: only for a batch the driver does not
        # hold, i.e. one planned by a query run that has ended. Its messages were requeued when that
        # run's connection closed and will be read again in a later batch.
        start_seq, end_seq = self._seq(start), self._seq(end)
        if end_seq > start_seq:
            log.warning("hutch source: replaying batch (%d, %d] of queue %r as empty: a queue cannot be "
                        "re-read; its %d messages were requeued by the broker and arrive again, "
                        "redelivered, in later batches", start_seq, end_seq, self.opts.queue,
                        end_seq - start_seq)
        return iter(())

    def commit(self, end: dict[str, Any]) -> None:
        self._settle(self._seq(end))

    def stop(self) -> None:
        client, self._client = self._client, None
        self._consuming = False
        self._ledger = None
        if client is not None:
            client.close()  # unacknowledged deliveries go back to the queue
