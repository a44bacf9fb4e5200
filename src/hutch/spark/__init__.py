"""hutch's PySpark data source: `spark.read`/`readStream`/`write`/`writeStream` with `format("hutch")`.

Install with `pip install hutch[spark]` (PySpark 4.2+ and pyarrow), then::

    from hutch.spark import HutchDataSource
    spark.dataSource.register(HutchDataSource)
    df = spark.readStream.format("hutch").option("uri", "amqp://...").option("queue", "orders").load()

Modules: `datasource` (the DataSource Spark instantiates), `source` (batch and streaming readers of a queue), `stream_source` (reads of a stream by offset),
`sink` (batch and streaming writers), `ledger` (streaming offsets and acknowledgements, pure),
`schema` (the row schema, deliveries -> Arrow), `options` (options and their checks), `client` (a small
synchronous AMQP client on hutch's codec). Guarantees and design: docs/spark.md.

Rule: this package imports pyspark (lazily, so `hutch.spark.options` and `hutch.spark.client` work
without it); nothing else in hutch imports `hutch.spark` - the broker never needs Spark.
"""

from __future__ import annotations

from typing import Any

__all__ = ["HutchDataSource", "HutchPythonDataSource", "register"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module 'hutch.spark' has no attribute {name!r}")
