"""The stream version of the orders pipeline end to end, with the Spark driver killed twice mid-batch.

    python examples/spark_orders/run_stream_demo.py --orders 20000

1. starts a hutch node on free ports with the stream protocol listener (or uses --uri/--stream-port),
   declares the super stream `orders.s` (4 partitions) and the results stream `orders.totals.s`;
2. publishes the orders with confirms, each to its customer's partition, recording them in a ledger;
3. runs the pipeline (stream_pipeline.py) as a separate driver process, and `kill -9`s its whole process
   group in the middle of a micro-batch, twice (--kills), restarting it from its checkpoint each time:
   first after the batch's Parquet, before its results reach the stream; then after its results are
   in the stream, before Spark commits the batch (so the replay's results are deduplicated);
4. lets the last run read to the end (`Trigger.AvailableNow`);
5. checks every (window, region) total in Parquet and in the results stream against the ledger, and
   that no result was stored twice. Exit status 1 if anything is missing, wrong or repeated.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pika
from orders import Ledger, connect
from run_demo import stop_and_clean
from stream_pipeline import (
    TOTALS_STREAM,
    declare_stream_topology,
    final_totals,
    ledger_totals,
    publish_stream_orders,
    stream_totals,
)

from hutch.spark.bench import start_node_ports

HERE = Path(__file__).resolve().parent


def read_stream(uri: str, stream: str, idle_s: float = 1.0, limit_s: float = 120.0) -> list[bytes]:
    """Every message body of a stream from its first offset (until none came for `idle_s`)."""
    out: list[bytes] = []
    with connect(uri) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)

        def on_message(c: Any, m: Any, _p: Any, body: bytes) -> None:
            out.append(body)
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
        deadline, last, seen = time.monotonic() + limit_s, time.monotonic(), 0
        while time.monotonic() < deadline and time.monotonic() - last < idle_s:
            conn.process_data_events(time_limit=0.2)
            if len(out) != seen:
                seen, last = len(out), time.monotonic()
    return out


def driver(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), *sys.path]))
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, str(HERE / "stream_pipeline.py"), *args], env=env,
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=f)


def kill_mid_batch(args: list[str], markers: Path, log: Path, timeout_s: float = 300.0) -> int:
    """Run the driver until one of its batches announces itself, then SIGKILL its process group.
    Returns the batch id it was killed in."""
    proc = driver(args, log)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            mine = list(markers.glob(f"inflight-*-{proc.pid}"))  # foreachBatch runs in the driver's process
            if mine:
                return int(mine[0].name.split("-")[1])
            if proc.poll() is not None:
                raise SystemExit(f"the driver exited ({proc.returncode}) before a batch started; see {log}")
            time.sleep(0.2)
        raise SystemExit(f"no micro-batch started within {timeout_s:.0f} s; see {log}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", help="use this broker instead of starting one")
    ap.add_argument("--stream-port", type=int, default=5552, help="with --uri: its stream protocol port")
    ap.add_argument("--orders", type=int, default=20_000)
    ap.add_argument("--kills", type=int, default=2, help="kill -9 the driver mid-batch this many times")
    ap.add_argument("--max-per-trigger", type=int, default=4000)
    ap.add_argument("--work", help="directory for the node, checkpoint, Parquet and logs, kept afterwards")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    work = Path(args.work or tempfile.mkdtemp(prefix="hutch-orders-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    node = None
    uri, stream_port = args.uri, args.stream_port
    out_dir, ck, markers = work / "totals", work / "checkpoint", work / "markers"
    markers.mkdir(exist_ok=True)
    log = work / "driver.log"
    try:
        if uri is None:
            node, ports = start_node_ports(work, "orders-stream-demo@localhost", "hutch-data",
                                           ("--stream-port", "0"))
            uri, stream_port = f"amqp://guest:guest@127.0.0.1:{ports['amqp']}/%2F", ports["stream"]
        declare_stream_topology(uri)
        ledger = Ledger.empty()
        took = publish_stream_orders(uri, args.orders, ledger)
        print(f"published {args.orders} orders to super stream orders.s (4 partitions) in {took:.1f} s, "
              "every one confirmed")
        common = ["--uri", uri, "--stream-port", str(stream_port), "--out", str(out_dir), "--checkpoint",
                  str(ck), "--max-per-trigger", str(args.max_per_trigger)]
        for k in range(args.kills):
            where = ("parquet", "results")[k % 2]
            batch = kill_mid_batch([*common, "--pause-in-batch", "60", "--marker-dir", str(markers),
                                    "--pause-after", where], markers, log)
            for m in markers.glob("inflight-*"):
                m.unlink()
            state = "its Parquet written, its results not yet published" if where == "parquet" else \
                "its Parquet and its results written, the batch not yet committed"
            print(f"kill -9 #{k + 1}: the driver's process group killed in the middle of micro-batch {batch} "
                  f"({state})")
        t0 = time.monotonic()
        final = driver([*common, "--available-now"], log)
        if final.wait(600) != 0:
            raise SystemExit(f"the last run failed ({final.returncode}); see {log}")
        print(f"restarted from the checkpoint: the last run read to the end in {time.monotonic() - t0:.1f} s")
        ok = check(work, out_dir, ledger, uri)
        print("OK: every confirmed order is counted exactly once, every result stored once" if ok else "FAILED")
        raise SystemExit(0 if ok else 1)
    finally:
        stop_and_clean(node, work, keep=args.work is not None)


def check(work: Path, out_dir: Path, ledger: Ledger, uri: str) -> bool:
    sys.path.insert(0, str(HERE))
    from pipeline import spark_session

    spark = spark_session()
    try:
        parquet = final_totals(spark, str(out_dir))
    finally:
        spark.stop()
    want = ledger_totals(ledger)
    streamed, repeats = stream_totals(read_stream(uri, TOTALS_STREAM))
    ok = True
    for name, got in (("Parquet", parquet), (f"stream {TOTALS_STREAM}", streamed)):
        missing = sorted(set(want) - set(got))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        extra = sorted(set(got) - set(want))
        counted = sum(v[0] for v in got.values())
        print(f"  {name}: {len(got)} (window, region) totals, {counted} orders counted; {len(missing)} missing, "
              f"{len(extra)} unexpected, {len(wrong)} wrong")
        ok = ok and not missing and not wrong and not extra and counted == ledger.published
    print(f"  results stored twice in the stream: {repeats}")
    return ok and repeats == 0


if __name__ == "__main__":
    pika.BasicProperties  # noqa: B018 - pika is a requirement of the example
    main()
