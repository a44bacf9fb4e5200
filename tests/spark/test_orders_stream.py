"""The orders example on streams (examples/spark_orders/stream_pipeline.py): a super stream of 4
partitions read by Spark in parallel, aggregated, written to Parquet and to a results stream, checked
against the publisher's ledger. The quick test runs the example's aggregation over a batch read of the
super stream (one Spark job: ~35 s of the streaming query's Spark overhead - state store, foreachBatch's
four jobs - left to the slow ones); the slow ones run the streaming pipeline in-process to the end, and
run_stream_demo.py, which `kill -9`s the driver twice in the middle of a micro-batch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo

from .helpers import Broker, amqp_uri, stream_messages

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_orders"


def fresh_topology(example: Any, server: ServerInfo) -> None:
    """The example's super stream and results stream, empty (the node is session-wide)."""
    b = Broker(server.amqp_port)
    try:
        for i in range(example.PARTITIONS):
            b.ch.queue_delete(f"{example.ORDERS_SUPER_STREAM}-{i}")
        b.ch.queue_delete(example.TOTALS_STREAM)
    finally:
        b.close()
    example.declare_stream_topology(amqp_uri(server.amqp_port))


@pytest.fixture
def example() -> Any:
    sys.path.insert(0, str(EXAMPLE))
    import stream_pipeline

    yield stream_pipeline
    sys.path.remove(str(EXAMPLE))


def test_the_examples_aggregation_over_a_batch_read_matches_the_ledger(
        spark: Any, stream_server: ServerInfo, example: Any, tmp_path: Path) -> None:
    from orders import Ledger

    uri = amqp_uri(stream_server.amqp_port)
    fresh_topology(example, stream_server)
    ledger = Ledger.empty()
    example.publish_stream_orders(uri, 300, ledger, seed=int(tmp_path.stat().st_ino % 1000))
    raw = (spark.read.format("hutch").option("uri", uri).option("superStream", example.ORDERS_SUPER_STREAM)
           .option("streamPort", str(stream_server.ports["stream"])).option("includeHeaders", "false").load())
    got = {(int(r.window_start.timestamp()), r.region): (r.orders, r.amount_cents)
           for r in example.totals(raw).collect()}
    assert got == example.ledger_totals(ledger)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stream_pipeline_totals_match_the_ledger(spark: Any, stream_server: ServerInfo, example: Any,
                                                 tmp_path: Path) -> None:
    from orders import Ledger

    uri, port = amqp_uri(stream_server.amqp_port), stream_server.ports["stream"]
    fresh_topology(example, stream_server)
    ledger = Ledger.empty()
    example.publish_stream_orders(uri, 1200, ledger, seed=int(tmp_path.stat().st_ino % 1000))
    before = len(stream_messages(stream_server.amqp_port, example.TOTALS_STREAM, 0, timeout=1))
    query = example.start(spark, uri, port, str(tmp_path / "out"), str(tmp_path / "ck"), available_now=True,
                          max_per_trigger=5000)
    assert query.awaitTermination(240), "the AvailableNow query did not finish"
    assert query.exception() is None
    want = example.ledger_totals(ledger)
    assert example.final_totals(spark, str(tmp_path / "out")) == want
    results = [b for _, b in stream_messages(stream_server.amqp_port, example.TOTALS_STREAM, before + 1)][before:]
    streamed, repeats = example.stream_totals(results)
    assert streamed == want and repeats == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_stream_demo_with_the_driver_killed_twice_mid_batch(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(EXAMPLE / "run_stream_demo.py"), "--orders", "8000",
                             "--max-per-trigger", "2000", "--work", str(tmp_path)],
                            capture_output=True, text=True, timeout=850)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:] + \
        (tmp_path / "driver.log").read_text(errors="replace")[-3000:]
    assert "kill -9 #2" in result.stdout and "OK: every confirmed order" in result.stdout
