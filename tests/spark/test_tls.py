"""The Spark data source over amqps:// (TLS, verified against a test CA): a batch read and a batch write
through a real hutch node's TLS listener."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.tls.conftest import start_tls_node

from .helpers import Broker

# the first Spark test of a run also starts the Spark session; slow (30 s): `make test` runs the Spark
# client over amqps in tests/tls/test_clients.py
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_batch_read_and_write_over_amqps(spark: Any, tmp_path: Path) -> None:
    node = start_tls_node(tmp_path, https=False)
    broker = Broker(node.info.amqp_port)
    try:
        uri = f"amqps://guest:guest@localhost:{node.amqps_port}/%2F?cacertfile={node.pki.cacertfile}"
        source, sink = broker.declare(), broker.declare()
        bodies = broker.publish(source, 50)
        rows = spark.read.format("hutch").option("uri", uri).option("queue", source).load().collect()
        assert [bytes(r.value).decode() for r in rows] == bodies
        assert broker.ready(source) == 0
        df = spark.createDataFrame([(f"w{i}".encode(),) for i in range(20)], "value binary")
        df.write.format("hutch").mode("append").option("uri", uri).option("routing_key", sink).save()
        assert broker.ready(sink) == 20
    finally:
        broker.close()
        node.info.stop()
