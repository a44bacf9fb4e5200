"""The benchmark's floor for a Python data source: Spark reading ready-made Arrow batches from Python.

Owns: `FloorDataSource` (`format("hutch-floor")`), a streaming source with the stream read's schema and
offsets, planned like the stream source (`maxOffsetsPerTrigger` as the read limit, each micro-batch's
range split over `minPartitions` tasks), whose tasks yield slices of one record batch built once per
process from stored records of the benchmark's shape. It costs what any Python data source costs
(Python workers, Arrow IPC to the JVM, Arrow -> rows) and nothing of the connector's (no broker, no
socket, no decoding per row), so `bench.py --streams` can split the connector's share of a pipeline
into what the Python Data Source API costs (this source beside Spark's built-in rate source) and what
the connector adds on top (the stream source beside this one). Its writer (`FloorWriter`) is the same for
a write: tasks that take their Arrow batches and drop them. Nothing here is used by the connector.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.queues.stream.amqp10 import from_091

from .records import stream_records_batch
from .schema import STREAM_SCHEMA
from .stream_source import SupportsTriggerAvailableNow, split_range

BATCH_ROWS = 10_000


@lru_cache(maxsize=4)
def _batch(size: int) -> Any:
    record = from_091(Message("", "k", BasicProperties(delivery_mode=2), b"x" * size))
    return stream_records_batch([(i, record) for i in range(BATCH_ROWS)], "floor", True)


class _Range(InputPartition):
    def __init__(self, index: int, start: int, end: int) -> None:
        super().__init__(index)
        self.start, self.end = start, end


class FloorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Planned like the stream source, Trigger.AvailableNow included: without `SupportsTriggerAvailableNow`
    Spark runs an AvailableNow query of a Python source as one micro-batch of everything, ignoring
    `maxOffsetsPerTrigger` - one batch where the stream source runs ten, which is no floor for it."""

    def __init__(self, rows: int, size: int, per_trigger: int, tasks: int) -> None:
        self.rows, self.size, self.per_trigger, self.tasks = rows, size, per_trigger, tasks

    def initialOffset(self) -> dict[str, Any]:
        return {"offset": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger) if self.per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        end = self.rows
        if isinstance(limit, ReadMaxRows):
            end = min(end, int(start["offset"]) + limit.max_rows)
        return {"offset": end}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[_Range]:
        return [_Range(i, s, e) for i, (s, e) in enumerate(split_range(int(start["offset"]), int(end["offset"]),
                                                                       self.tasks))]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Range)
        batch = _batch(self.size)
        left = partition.end - partition.start
        while left > 0:
            take = min(left, BATCH_ROWS)
            yield batch.slice(0, take)
            left -= take

    def prepareForTriggerAvailableNow(self) -> None:
        pass  # the end is fixed (`rows`)

    def commit(self, end: dict[str, Any]) -> None:
        pass


class FloorWriter(DataSourceArrowWriter):
    """A write's floor: each task takes its Arrow batches (as the stream sink takes them) and drops them."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        rows = 0
        for batch in iterator:
            rows += batch.num_rows
        return WriterCommitMessage()


class FloorDataSource(DataSource):
    """Options: rows, size (body bytes), perTrigger, tasks (reads); none (writes: `FloorWriter`)."""

    @classmethod
    def name(cls) -> str:
        return "hutch-floor"

    def schema(self) -> StructType:
        return STREAM_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        o = self.options
        return FloorStreamReader(int(o["rows"]), int(o["size"]), int(o.get("perTrigger", 0)), int(o.get("tasks", 1)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return FloorWriter()


__all__ = ["FloorDataSource", "FloorStreamReader", "FloorWriter"]
