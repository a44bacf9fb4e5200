"""Idempotent writes from Spark to a stream or a super stream, over the stream protocol.

Owns: `check_stream_write_schema` (the columns a DataFrame written to a stream may have),
`publisher_reference` and `publishing_id` (the deduplication keys), and `StreamPublisher` (one task's
publishing, with confirms). `HutchWriter` / `HutchStreamWriter` (sink.py) hand a task to it when the
`stream` or `superStream` option is set.

Exactly-once into the stream rests on the broker's deduplication (osiris's, and hutch's: docs/streams.md):
a publisher declared with a *reference* has the highest publishing id stored for that reference kept
with the stream, and a publish whose id is at or below it is confirmed without being stored again. So:
- reference = `<query>-<spark partition>` (query: the streaming query's id, stable across restarts from
  a checkpoint, or `writeId` for a batch write), declared on each stream the task writes to;
- publishing id = `batch << 32 | (row + 1)`: batch the micro-batch id (0 for a batch write), row the
  row's index in the task's partition. Ids grow along a task's rows and from batch to batch, as the
  broker's rule needs; a task Spark re-runs, or a micro-batch it replays after a failure or a driver
  crash, sends the same rows with the same ids, and the broker stores each once.
The assumption (Spark's, for any idempotent sink): a replayed batch has the same rows in the same
partitions in the same order, which holds for a deterministic query over a replayable source (a
stream read by offset, Kafka, files).

Where a task writes: each stream at its leader. The task connects to the first of `uri`'s host and
`hosts` that answers (spark/hosts.py), asks the `metadata` command where its streams live and publishes
each stream on a connection to its leader's advertised host and stream port (the connection it has
when that node is the leader, else one more from the pool: a super stream whose partitions' leaders
are on three nodes takes three). A leader that cannot be reached at its advertised address (an address
not routable from the executor) is written through the node the task is connected to, which forwards
to the writer (docs/streams.md, "Stream-protocol publishers on any member"). A leader that changes
during the write is no different from a connection lost: the task fails, Spark re-runs it, the new
leader is asked for, and the broker's deduplication (kept with the stream, so on the new leader too)
stores each row once.

Rules: a task returns its commit message only after every publishing id is confirmed; its connections
come from the executor process's pool (spark/pool.py) and go back there with their publishers deleted; a
publish error fails the task (Spark retries it: the retry is deduplicated). Bounded: at most
`maxUnconfirmed` messages unconfirmed per task, over all its connections. A super stream's partitions
are asked for once per task (`partitions`) and a row goes to `partition_of(key)` (routing.py, the
RabbitMQ clients' murmur3 hash).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.queues.stream.amqp10 import _plain_prefix, from_091

from . import writerows as rows
from .hosts import host_port
from .options import HutchOptionError, WriteOptions
from .pool import pooled, pooled_on
from .routing import partition_of
from .streamclient import StreamClient, StreamClientError, code_name
from .writerows import HutchCommitMessage, HutchWriteError

ROW_BITS = 32
MAX_ROWS_PER_TASK = (1 << ROW_BITS) - 1
PUBLISH_CHUNK = 1000  # rows encoded and sent per publish call
STREAM_WRITE_COLUMNS = ("value", "key", "routing_key", "headers", "properties")
# Columns of a stream read that a stream write ignores (a DataFrame read from a stream can be written back).
IGNORED_STREAM_COLUMNS = ("stream", "partition", "offset", "timestamp", "exchange")

log = logging.getLogger("hutch.spark")


def publisher_reference(query: str, spark_partition: int) -> str:
    return f"{query}-{spark_partition}"


def publishing_id(batch_id: int, row: int) -> int:
    """The deduplication id of a task's `row` (0-based) in micro-batch `batch_id`: increasing in both."""
    assert 0 <= row < MAX_ROWS_PER_TASK and batch_id >= 0
    return batch_id << ROW_BITS | (row + 1)


_U32 = struct.Struct(">I")
_PROPERTIES_ONE_FIELD = b"\x00\x53\x73\xd0"  # the properties section: a list32 (the broker's encoder writes lists so)
_DATA8, _DATA32 = b"\x00\x53\x75\xa0", b"\x00\x53\x75\xb0"


class PlainRecords:
    """The stored record of a row without `headers` or `properties` (delivery mode 2 and the row's message
    id: what most rows are), built straight from its parts: the same bytes as `from_091` of that message
    (a Hypothesis property in tests/spark/test_records.py) at a tenth of its cost, no property list
    encoded and decoded on the way. The header and annotations depend on (exchange, routing key) only:
    the last pair's are kept (a task writes one stream, or rows routed by many keys)."""

    def __init__(self) -> None:
        self._route: tuple[str, str] | None = None
        self._prefix = b""

    def record(self, exchange: str, routing_key: str, message_id: str, body: bytes) -> bytes:
        route = (exchange, routing_key)
        if route != self._route:
            self._route, self._prefix = route, _plain_prefix(exchange, routing_key, 2)
        mid = message_id.encode("utf-8")
        item = (b"\xa1" + bytes((len(mid),)) if len(mid) < 256 else b"\xb1" + _U32.pack(len(mid))) + mid
        n = len(body)
        return b"".join((self._prefix, _PROPERTIES_ONE_FIELD, _U32.pack(len(item) + 4), b"\x00\x00\x00\x01",
                         item, _DATA8 + bytes((n,)) if n < 256 else _DATA32 + _U32.pack(n), body))


def check_stream_write_schema(schema: StructType, opts: WriteOptions) -> None:
    """Raise HutchOptionError unless `schema` is a DataFrame hutch can write to `opts`' (super) stream."""
    by_name = rows.columns_checked(
        schema, STREAM_WRITE_COLUMNS, IGNORED_STREAM_COLUMNS,
        "a DataFrame written to a stream has the columns value (binary or string, required), key (string: a "
        "super stream's routing key), headers (map<string, ...>), properties (struct of AMQP properties)")
    key_column = "key" if "key" in by_name else "routing_key" if "routing_key" in by_name else None
    if key_column is not None and not isinstance(by_name[key_column], StringType):
        raise HutchOptionError(f"hutch sink: column '{key_column}' must be string, got "
                               f"{rows.type_name(by_name[key_column])}")
    if opts.super_stream is not None and key_column is None:
        raise HutchOptionError("hutch sink: a write to a super stream routes each row by its 'key' column "
                               "(string; 'routing_key' also works): add one")
    if "properties" in by_name:
        rows.check_properties(by_name["properties"])
    assert isinstance(by_name["value"], (BinaryType, StringType))
    assert "headers" not in by_name or isinstance(by_name["headers"], MapType)


class StreamPublisher:
    """One task's rows (Arrow record batches) -> publishes on a stream-protocol connection."""

    def __init__(self, opts: WriteOptions, query: str, batch_id: int, partition_id: int) -> None:
        self.opts = opts
        self.query = query
        self.batch_id = batch_id
        self.partition_id = partition_id
        self.reference = publisher_reference(query, partition_id)
        self.count = 0
        self.first_id: str | None = None
        self.last_id: str | None = None

    def _fail(self, what: str) -> HutchWriteError:
        return HutchWriteError(f"hutch sink (stream {self.opts.target!r}, partition {self.partition_id}): {what}; "
                               "the task fails and Spark retries it (rows already stored are deduplicated "
                               "by the broker)")

    def run(self, batches: Iterator[Any]) -> HutchCommitMessage:
        opts = self.opts
        streams: list[str] = []
        name, timeout_s = f"hutch-spark write {self.reference}", opts.confirm_timeout_ms / 1000
        try:
            with ExitStack() as stack:
                client = stack.enter_context(pooled(opts.stream_uris(), name, timeout_s))
                if opts.super_stream is not None:
                    streams = client.partitions(opts.super_stream)
                    if not streams:
                        raise StreamClientError(f"super stream {opts.super_stream!r} has no partitions")
                else:
                    assert opts.stream is not None
                    streams = [opts.stream]
                # publisher id = the stream's index, on the connection to its leader
                links = self._leaders(stack, client, streams, name, timeout_s)
                for pid, stream in enumerate(streams):
                    links[pid].declare_publisher(pid, self.reference, stream)
                for batch in batches:
                    self._publish_batch(links, batch, streams)
                clients = list({id(link): link for link in links}.values())
                for each in clients:
                    each.wait_confirms(at_most=0)
                errors = [(pid, e) for each in clients for pid, errs in each.errors.items() for e in errs]
                for pid, link in enumerate(links):  # connections go back to the pool without publishers
                    link.delete_publisher(pid)
        except StreamClientError as exc:
            raise self._explain(exc) from None
        if errors:
            pid, (_, code) = errors[0]
            raise self._fail(f"the broker refused {len(errors)} of {self.count} messages (first: "
                             f"{code_name(code)} on stream {streams[pid]!r})")
        return HutchCommitMessage(self.partition_id, self.count, self.first_id, self.last_id)

    def _explain(self, exc: StreamClientError) -> HutchWriteError:
        target = self.opts.super_stream or self.opts.stream
        if exc.code == 0x02:  # STREAM_DOES_NOT_EXIST
            kind = "super stream" if self.opts.super_stream else "stream"
            return self._fail(f"{kind} {target!r} does not exist in vhost {self.opts.uri.vhost!r} ({exc}); "
                              "declare it first")
        return self._fail(f"after {self.count} messages: {exc}")

    def _leaders(self, stack: ExitStack, client: StreamClient, streams: list[str], name: str,
                 timeout_s: float) -> list[StreamClient]:
        """For each stream, the connection to publish it on: to its leader (from `metadata`), opened from
        the pool within `stack` unless `client` is on it; `client` when the broker names no leader or the
        leader's advertised address does not answer (the node forwards to the writer)."""
        placement = client.placement(streams)
        by_leader: dict[tuple[str, int], StreamClient] = {}
        out: list[StreamClient] = []
        for stream in streams:
            where = placement.get(stream)
            leader = where.leader if where is not None else None
            if leader is None:
                out.append(client)
                continue
            if leader not in by_leader:
                on_leader = pooled_on(stack, client, [leader], name, timeout_s)
                if on_leader is None:
                    log.warning("hutch sink: the leader of stream %r at %s:%s does not answer; writing through "
                                "%s", stream, leader[0], leader[1], host_port(client.uri))
                by_leader[leader] = on_leader or client
            out.append(by_leader[leader])
        return out

    def _publish_batch(self, links: list[StreamClient], batch: Any, streams: list[str]) -> None:
        opts = self.opts
        n = batch.num_rows
        names = [name.lower() for name in batch.schema.names]
        cols = {name: batch.column(i) for i, name in enumerate(names)}
        values = cols["value"].to_pylist()
        key_col = cols.get("key", cols.get("routing_key"))
        keys = key_col.to_pylist() if key_col is not None else None
        headers = cols["headers"].to_pylist() if "headers" in cols else None
        props = cols["properties"].to_pylist() if "properties" in cols else None
        n_streams = len(streams)
        super_stream = opts.super_stream
        exchange = super_stream or ""
        limit = opts.max_unconfirmed
        clients = list({id(link): link for link in links}.values())
        max_bytes = min(each.max_message_bytes() for each in clients)
        id_prefix = f"{self.query}:{self.batch_id}:{self.partition_id}"
        plain = PlainRecords()
        for lo in range(0, n, PUBLISH_CHUNK):
            hi = min(n, lo + PUBLISH_CHUNK)
            out: list[list[tuple[int, bytes]]] = [[] for _ in streams]
            for i in range(lo, hi):
                body = values[i]
                if body is None:
                    raise self._fail(f"row {self.count} has a null 'value'; filter nulls out or coalesce them")
                if isinstance(body, str):
                    body = body.encode()
                if self.count >= MAX_ROWS_PER_TASK:
                    raise self._fail(f"more than {MAX_ROWS_PER_TASK} rows in one task; repartition the "
                                     "DataFrame")
                key = keys[i] if keys is not None else None
                if super_stream is not None and key is None:
                    raise self._fail(f"row {self.count} has a null 'key'; a super stream routes by it")
                target = partition_of(key, n_streams) if key is not None and super_stream is not None else 0
                message_id = f"{id_prefix}:{self.count}"
                row_props = props[i] if props is not None else None
                row_headers = headers[i] if headers is not None else None
                if row_props or row_headers:
                    p = BasicProperties(message_id=message_id, delivery_mode=2)
                    if row_props:
                        rows.apply_properties(p, row_props)
                        assert p.message_id is not None
                        message_id = p.message_id
                    if row_headers:
                        p.headers = {str(k): rows.header_value(v) for k, v in row_headers}
                    encoded = from_091(Message(exchange, key or streams[target], p, body))
                else:
                    encoded = plain.record(exchange, key or streams[target], message_id, body)
                if len(encoded) > max_bytes:
                    raise self._fail(f"row {self.count}: its message ({len(encoded)} bytes encoded) is larger "
                                     f"than the broker's stream frame_max allows ({max_bytes})")
                out[target].append((publishing_id(self.batch_id, self.count), encoded))
                if self.first_id is None:
                    self.first_id = message_id
                self.last_id = message_id
                self.count += 1
            count = hi - lo
            for each in clients:  # the task's bound, shared by its connections
                each.wait_confirms(max(0, limit - count) // len(clients))
            for pid, entries in enumerate(out):
                if entries:
                    links[pid].publish(pid, entries)


__all__ = ["PlainRecords", "StreamPublisher", "check_stream_write_schema", "publisher_reference", "publishing_id"]
