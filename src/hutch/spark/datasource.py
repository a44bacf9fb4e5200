"""The `hutch` PySpark data source: the entry point Spark instantiates.

Owns: `HutchDataSource` (`name()` is "hutch"), `HutchPythonDataSource` (the same source as
"hutch-python") and `register(spark)`, which decides who answers to `format("hutch")`: with the JVM
reader's jar on the session's class path (`spark.jars`, `hutch.spark.jvm.jar_path()`), its `HutchProvider`
(stream and super stream reads in the JVM, the rest handed to "hutch-python"); without it, this source
(one log line says which, and why).

Rules: the data source object is created by Spark in a Python process from the options the user gave;
it resolves and checks them (`hutch.spark.options`) and hands the resolved, picklable options to the
reader or writer it creates. It opens no connection itself.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .options import HutchOptionError, read_options, reads_stream, stream_read_options, write_options
from .schema import READ_SCHEMA, STREAM_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

    from .sink import HutchStreamWriter, HutchWriter
    from .source import HutchStreamReader


class HutchDataSource(DataSource):
    """Read from and write to a hutch (or any AMQP 0-9-1) broker. Register it with
    `spark.dataSource.register(HutchDataSource)`, then use `format("hutch")`."""

    @classmethod
    def name(cls) -> str:
        return "hutch"

    def schema(self) -> StructType:
        # Spark calls schema() for reads only (at load()), so a bad read option fails right there.
        if reads_stream(self.options):
            lower = {str(k).lower() for k in self.options}
            stream_read_options(self.options, streaming=not {"endingoffsets", "endingtimestamp"} & lower)
            return STREAM_SCHEMA
        read_options(self.options)
        return READ_SCHEMA

    def _check_read_schema(self, schema: StructType) -> None:
        expected = STREAM_SCHEMA if reads_stream(self.options) else READ_SCHEMA
        if schema != expected:
            raise HutchOptionError(
                "hutch source: the schema of a hutch read is fixed; remove .schema(...) "
                f"(expected {expected.simpleString()}, got {schema.simpleString()})")

    def reader(self, schema: StructType) -> DataSourceReader:
        from .source import HutchBatchReader

        self._check_read_schema(schema)
        if reads_stream(self.options):
            from .stream_source import HutchStreamBatchReader
            from .super_source import HutchSuperStreamBatchReader

            opts = stream_read_options(self.options, streaming=False)
            if opts.super_stream is not None:
                return HutchSuperStreamBatchReader(opts)
            return HutchStreamBatchReader(opts)
        return HutchBatchReader(read_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A stream or super stream (`stream`/`superStream`): offset ranges read by the executors,
        exactly-once. A queue: not
        implemented here, so Spark falls back to `simpleStreamReader` (a driver-side consumer)."""
        if not reads_stream(self.options):
            from pyspark.errors import PySparkNotImplementedError

            raise PySparkNotImplementedError(errorClass="NOT_IMPLEMENTED",
                                             messageParameters={"feature": "streamReader"})
        from .stream_source import HutchStreamOffsetReader
        from .super_source import HutchSuperStreamOffsetReader

        self._check_read_schema(schema)
        opts = stream_read_options(self.options, streaming=True)
        if opts.super_stream is not None:
            return HutchSuperStreamOffsetReader(opts)
        return HutchStreamOffsetReader(opts)

    def simpleStreamReader(self, schema: StructType) -> HutchStreamReader:
        from .source import HutchStreamReader

        self._check_read_schema(schema)
        return HutchStreamReader(read_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> HutchWriter:
        from .sink import HutchWriter, check_write_schema

        _refuse_overwrite(overwrite)
        opts = write_options(self.options)
        check_write_schema(schema, opts)
        return HutchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> HutchStreamWriter:
        from .sink import HutchStreamWriter, check_write_schema

        _refuse_overwrite(overwrite)
        opts = write_options(self.options)
        check_write_schema(schema, opts)
        return HutchStreamWriter(opts)


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise HutchOptionError("hutch sink: a broker cannot be overwritten; use mode('append') "
                               "(or outputMode('append') for a stream)")


class HutchPythonDataSource(HutchDataSource):
    """The Python source under the name "hutch-python": what the JVM reader's `format("hutch")` hands
    reads of a queue and every write to (and a name to ask for the Python source's stream reads by)."""

    @classmethod
    def name(cls) -> str:
        return "hutch-python"


ROUTER_CLASS = "hutch.spark.jvm.HutchProvider"
_log = logging.getLogger("hutch.spark")


def jvm_reader_loaded(spark: SparkSession) -> bool:
    """Whether the session's driver can load the JVM reader's `format("hutch")` provider (its jar in
    `spark.jars`); False for a session without a JVM at hand (Spark Connect)."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return False
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable(ROUTER_CLASS))
    except Exception:  # py4j: any failure to ask means no
        return False


def register(spark: SparkSession) -> str:
    """Register hutch's data source with `spark` and say (one log line, and the return value) who reads
    streams for `format("hutch")`: "jvm" when the JVM reader's jar is on the session's class path (its
    `HutchProvider` takes the name "hutch"; this source is registered as "hutch-python" and does the
    rest), else "python" (this source takes "hutch", and "hutch-python" too). Spark refuses a JVM provider
    and a Python source of one name, so with the jar loaded `spark.dataSource.register(HutchDataSource)`
    must not be called: use this."""
    spark.dataSource.register(HutchPythonDataSource)
    if jvm_reader_loaded(spark):
        _log.info("hutch: format('hutch') reads streams with the JVM reader (its jar is on the session's "
                  "class path); queues and writes go to the Python source ('hutch-python')")
        return "jvm"
    spark.dataSource.register(HutchDataSource)
    _log.warning("hutch: format('hutch') reads streams with the Python source: the JVM reader's jar is not on "
              "the session's class path (SparkSession.builder.config('spark.jars', hutch.spark.jvm.jar_path()))")
    return "python"


__all__: list[Any] = ["HutchDataSource", "HutchPythonDataSource", "jvm_reader_loaded", "register"]
