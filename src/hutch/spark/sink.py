"""Writing to hutch from Spark: `df.write.format("hutch")` and `df.writeStream.format("hutch")`.

Owns: `check_write_schema` (which columns a DataFrame may have and of which types), `Publisher` (one
task's AMQP 0-9-1 publishing with publisher confirms), `HutchWriter` (batch) and `HutchStreamWriter`
(streaming). With the `stream` or `superStream` option a task is handed to `stream_sink.StreamPublisher`
instead (idempotent, over the stream protocol); what both share is in `writerows.py`.

Where the code runs: `writer()`/`streamWriter()` and the column check run on the driver when the write
starts (a bad column fails the job or query before any task runs); `write()` runs on executors, one
AMQP connection per task; `commit()`/`abort()` run on the driver.

Rules:
- A task returns its commit message only after the broker has confirmed every message it published
  (publisher confirms): a task that succeeded has handed every row to the broker (at-least-once). A
  negative confirm, an unroutable message (with `mandatory`, the default), a lost connection or a
  confirm timeout fails the task, and Spark retries it.
- A retried task or a replayed micro-batch republishes the same rows with the same `message_id`:
  `<query>:<batch>:<partition>:<row>`, where query is the streaming query's id (stable across restarts
  from a checkpoint) or, for a batch write, `writeId` (a random id per write unless given), batch is the
  micro-batch id (0 for a batch write), partition the Spark partition id and row the row's index in the
  partition. A row whose `properties.message_id` is set keeps its own id.
- Bounded: at most `maxUnconfirmed` messages per task are published and unconfirmed at any time.
"""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import StringType, StructType

from hutch.amqp.spec import FLAG_DELIVERY_MODE, PROPERTY_NAMES, BasicProperties

from .client import AmqpClient, ClientClosed
from .hosts import first_answering
from .options import HutchOptionError, WriteOptions
from .stream_sink import StreamPublisher, check_stream_write_schema
from .writerows import (
    HutchCommitMessage,
    HutchWriteError,
    apply_properties,
    check_properties,
    columns_checked,
    header_value,
    type_name,
)

log = logging.getLogger("hutch.spark")

WRITE_COLUMNS = ("value", "routing_key", "exchange", "headers", "properties")
# Columns of the hutch source that the sink does not use: a DataFrame read from hutch can be written
# back unchanged (its properties, message_id included, and headers are republished).
IGNORED_SOURCE_COLUMNS = ("queue", "delivery_tag", "redelivered", "timestamp", "delivery_count")
PUBLISH_CHUNK = 500  # messages encoded and written per socket write
# The property list of a row with neither headers nor properties: delivery-mode and message-id only,
# encoded without building a BasicProperties (the write path's hot loop).
_PLAIN_FLAGS = struct.pack(">H", FLAG_DELIVERY_MODE | 1 << (15 - PROPERTY_NAMES.index("message_id")))


def check_write_schema(schema: StructType, opts: WriteOptions) -> None:
    """Raise HutchOptionError unless `schema` is a DataFrame hutch can publish with `opts`."""
    if opts.to_stream:
        check_stream_write_schema(schema, opts)
        return
    by_name = columns_checked(
        schema, WRITE_COLUMNS, IGNORED_SOURCE_COLUMNS,
        "a DataFrame written to hutch has the columns value (binary or string, required), routing_key "
        "(string), exchange (string), headers (map<string, ...>), properties (struct of AMQP properties)")
    for name in ("routing_key", "exchange"):
        kind = by_name.get(name)
        if kind is not None and not isinstance(kind, StringType):
            raise HutchOptionError(f"hutch sink: column '{name}' must be string, got {type_name(kind)}")
    props = by_name.get("properties")
    if props is not None:
        check_properties(props)
    exchange_known = opts.exchange is not None or "exchange" in by_name
    routing_known = opts.routing_key is not None or "routing_key" in by_name
    if not routing_known and (opts.exchange == "" or not exchange_known):
        raise HutchOptionError(
            "hutch sink: nothing says where messages go: set option 'exchange' (and 'routing_key' if the "
            "exchange needs one), or give the DataFrame 'exchange'/'routing_key' columns; publishing to the "
            "default exchange needs a routing key, the name of the target queue")


class Publisher:
    """One task's publishing: rows (Arrow record batches) -> basic.publish with confirms."""

    def __init__(self, opts: WriteOptions, id_prefix: str, partition_id: int) -> None:
        self.opts = opts
        self.id_prefix = id_prefix
        self.partition_id = partition_id
        self.client: AmqpClient | None = None
        self.count = 0
        self.first_id: str | None = None
        self.last_id: str | None = None
        self._prefixes: dict[tuple[str, str], bytes] = {}

    def _fail(self, what: str, exc: Exception) -> HutchWriteError:
        return HutchWriteError(f"hutch sink (partition {self.partition_id}): {what}: {exc}; the task fails "
                               "and Spark retries it (messages already published are published again "
                               "with the same message_id)")

    def run(self, batches: Iterator[Any]) -> HutchCommitMessage:
        opts = self.opts
        try:
            name, send_timeout_s = f"hutch-spark write {self.id_prefix}", opts.confirm_timeout_ms / 1000
            self.client = first_answering(
                opts.uris(), lambda uri: AmqpClient(uri, connection_name=name, send_timeout_s=send_timeout_s).connect(),
                ClientClosed)
            self.client.confirm_select()
        except ClientClosed as exc:
            raise self._fail("cannot open a publishing connection", exc) from None
        client = self.client
        try:
            for batch in batches:
                self._publish_batch(batch)
            client.wait_confirms(0, opts.confirm_timeout_ms / 1000)
        except ClientClosed as exc:
            client.close()
            raise self._fail(f"after {self.count} messages", exc) from None
        except BaseException:
            client.close()
            raise
        nacked, returned = client.publish_outcome()
        client.close()
        if nacked:
            raise HutchWriteError(f"hutch sink (partition {self.partition_id}): the broker refused (nacked) "
                                  f"{nacked} of {self.count} messages; the task fails and Spark retries it")
        if returned:
            r = returned[0]
            raise HutchWriteError(
                f"hutch sink (partition {self.partition_id}): {len(returned)} of {self.count} messages were "
                f"unroutable (first: exchange {r.exchange!r}, routing key {r.routing_key!r}: {r.reply_code} "
                f"{r.reply_text}); bind a queue, fix the routing, or set option mandatory=false to let the "
                "broker drop unroutable messages")
        return HutchCommitMessage(self.partition_id, self.count, self.first_id, self.last_id)

    def _publish_batch(self, batch: Any) -> None:
        client = self.client
        assert client is not None
        opts = self.opts
        n = batch.num_rows
        names = [name.lower() for name in batch.schema.names]
        cols = {name: batch.column(i) for i, name in enumerate(names)}
        values = cols["value"].to_pylist()
        if opts.exchange is not None:
            exchanges: list[Any] = [opts.exchange] * n
        else:
            exchanges = cols["exchange"].to_pylist() if "exchange" in cols else [""] * n
        if opts.routing_key is not None:
            keys: list[Any] = [opts.routing_key] * n
        else:
            keys = cols["routing_key"].to_pylist() if "routing_key" in cols else [""] * n
        headers = cols["headers"].to_pylist() if "headers" in cols else None
        props = cols["properties"].to_pylist() if "properties" in cols else None
        mandatory = opts.mandatory
        delivery_mode = opts.delivery_mode
        prefixes = self._prefixes
        content = client.content
        limit = opts.max_unconfirmed
        timeout_s = opts.confirm_timeout_ms / 1000
        for lo in range(0, n, PUBLISH_CHUNK):
            hi = min(n, lo + PUBLISH_CHUNK)
            out: list[bytes] = []
            for i in range(lo, hi):
                body = values[i]
                if body is None:
                    raise HutchWriteError(f"hutch sink (partition {self.partition_id}): row {self.count} has a "
                                          "null 'value'; filter nulls out or coalesce them before writing")
                if isinstance(body, str):
                    body = body.encode()
                route = (exchanges[i] or "", keys[i] or "")
                prefix = prefixes.get(route)
                if prefix is None:
                    prefix = prefixes[route] = client.publish_frame_prefix(route[0], route[1], mandatory)
                message_id = f"{self.id_prefix}:{self.count}"
                row_props = props[i] if props is not None else None
                row_headers = headers[i] if headers is not None else None
                if row_props or row_headers:
                    p = BasicProperties(message_id=message_id, delivery_mode=delivery_mode)
                    if row_props:
                        apply_properties(p, row_props)
                        assert p.message_id is not None  # set above; a row's null leaves it as it is
                        message_id = p.message_id
                    if row_headers:
                        p.headers = {str(k): header_value(v) for k, v in row_headers}
                    raw = p.encode()
                else:
                    mid = message_id.encode()
                    raw = b"".join((_PLAIN_FLAGS, bytes((delivery_mode, len(mid))), mid))
                out.append(prefix)
                out.extend(content(raw, body))
                if self.first_id is None:
                    self.first_id = message_id
                self.last_id = message_id
                self.count += 1
            count = hi - lo
            if limit > count:
                client.wait_confirms(limit - count, timeout_s)
            else:
                client.wait_confirms(0, timeout_s)
            client.send_publishes(out, count)

def _task_context() -> tuple[int, Any]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, None
    return ctx.partitionId(), ctx


class HutchWriter(DataSourceArrowWriter):
    """`df.write.format("hutch")`: publish every row with confirms."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.write_id = opts.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> HutchCommitMessage:
        partition_id, _ = _task_context()
        if self.opts.to_stream:
            return StreamPublisher(self.opts, self.write_id, 0, partition_id).run(iterator)
        return Publisher(self.opts, f"{self.write_id}:0:{partition_id}", partition_id).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        total = sum(m.messages for m in messages if isinstance(m, HutchCommitMessage))
        log.info("hutch sink: write %s published %d messages, all confirmed", self.write_id, total)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.messages for m in messages if isinstance(m, HutchCommitMessage))
        log.warning("hutch sink: write %s failed; %d messages from successful tasks stay published",
                    self.write_id, done)


class HutchStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("hutch")`: publish every row of each micro-batch with confirms."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts
        self.fallback_id = uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> HutchCommitMessage:
        partition_id, ctx = _task_context()
        query_id = batch_id = None
        if ctx is not None:
            query_id = ctx.getLocalProperty("sql.streaming.queryId")
            batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        if self.opts.to_stream:
            return StreamPublisher(self.opts, query_id or self.fallback_id, int(batch_id or 0),
                                   partition_id).run(iterator)
        prefix = f"{query_id or self.fallback_id}:{batch_id or 0}:{partition_id}"
        return Publisher(self.opts, prefix, partition_id).run(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        total = sum(m.messages for m in messages if isinstance(m, HutchCommitMessage))
        log.info("hutch sink: micro-batch %d published %d messages, all confirmed", batchId, total)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("hutch sink: micro-batch %d failed; it will be published again when the query "
                    "restarts (same message ids)", batchId)
