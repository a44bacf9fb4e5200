"""The orders pipeline end to end on one machine, checked against what the publisher confirmed.

    python examples/spark_orders/run_demo.py --orders 60000 --rate 2000

1. starts a hutch node on free ports, its inter-node port included (or uses --uri), declares the topology;
2. starts the Spark pipeline (pipeline.py, local[2], one micro-batch a second);
3. publishes orders at --rate with publisher confirms, recording every confirmed order in a ledger;
4. halfway through, stops the pipeline and starts it again from its checkpoint (--no-interrupt to skip);
5. when every order has been consumed, publishes one "tick" order a minute ahead so the watermark
   closes the last windows, and waits for them;
6. checks every (window, region) total in Parquet and in the `orders.totals.audit` queue against the
   ledger, and prints the figures. Exit status 1 if anything is missing or wrong.

Quiet by default: Spark logs errors only (`-v` for its INFO and WARN logs). The node, the checkpoint
and the Parquet output live in a temporary directory removed at the end (`--work DIR` keeps them).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
from orders import (
    ORDERS_QUEUE,
    TOTALS_AUDIT_QUEUE,
    Ledger,
    connect,
    declare_topology,
    publish_orders,
    publish_watermark_tick,
)
from pipeline import spark_session, start

from hutch.spark.bench import start_node


def start_hutch(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    return start_node(work, node_name="orders-demo@localhost", data_dir_name="hutch-data")


def stop_and_clean(node: subprocess.Popen[bytes] | None, work: Path, keep: bool) -> None:
    """The end of a demo: its node stopped, its working directory removed unless `keep`."""
    if node is not None:
        node.terminate()
        node.wait(10)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def ready(uri: str, queue: str) -> int:
    with connect(uri) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def audit_messages(uri: str) -> list[tuple[str, bytes]]:
    out = []
    with connect(uri) as conn:
        ch = conn.channel()
        while True:
            method, props, body = ch.basic_get(TOTALS_AUDIT_QUEUE, auto_ack=True)
            if method is None:
                return out
            out.append((props.message_id, body))


def counted_orders(spark: Any, out_dir: str) -> int:
    """Orders counted in the Parquet output so far (0 while there is none)."""
    from pyspark.errors import AnalysisException

    if not os.path.isdir(out_dir):
        return 0
    try:
        total = spark.read.parquet(out_dir).where("region != 'tick'").groupBy().sum("orders").first()[0]
    except AnalysisException:  # directories without files yet
        return 0
    return int(total or 0)


def totals_written(spark: Any, out_dir: str) -> int:
    """Distinct (window, region) totals in the Parquet output so far, the tick's included."""
    if not os.path.isdir(out_dir):
        return 0
    return int(spark.read.parquet(out_dir).select("window_start", "region").distinct().count())


def check(spark: Any, out_dir: str, ledger: Ledger, uri: str) -> bool:
    rows = spark.read.parquet(out_dir).where("region != 'tick'").collect()
    got: dict[tuple[int, str], tuple[int, int]] = {}
    for r in rows:  # a replayed micro-batch may emit a window again, with the same totals
        got[(int(r.window_start.timestamp()), r.region)] = (r.orders, r.amount_cents)
    want = {k: (ledger.orders[k], ledger.cents[k]) for k in ledger.orders}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
    counted = sum(v[0] for v in got.values())
    audit = audit_messages(uri)
    audit_ids = {mid for mid, _ in audit if not mid.endswith("|tick")}
    print(f"  Parquet: {len(got)} (window, region) totals, {counted} orders counted; "
          f"{len(missing)} missing, {len(extra)} unexpected, {len(wrong)} wrong")
    print(f"  hutch exchange orders.totals: {len(audit)} messages, {len(audit_ids)} distinct totals")
    ok = not missing and not extra and not wrong and counted == ledger.published and len(audit_ids) == len(want)
    for k in (missing + wrong)[:5]:
        print(f"    {k}: want {want.get(k)}, got {got.get(k)}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", help="use this broker instead of starting one")
    ap.add_argument("--orders", type=int, default=60_000)
    ap.add_argument("--rate", type=float, default=2000.0, help="orders per second")
    ap.add_argument("--no-interrupt", action="store_true", help="do not restart the pipeline halfway")
    ap.add_argument("--backlog", action="store_true",
                    help="publish every order before the pipeline starts, to time the pipeline alone")
    ap.add_argument("--work", help="directory for the checkpoint, Parquet and logs, kept afterwards "
                    "(default: a temporary directory, removed at the end)")
    ap.add_argument("-v", "--verbose", action="store_true", help="Spark's own logs (INFO and WARN)")
    args = ap.parse_args()
    # SIGTERM ends the demo as Ctrl-C does: its node stopped and its temporary directory removed
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    work = Path(args.work or tempfile.mkdtemp(prefix="hutch-orders-"))
    work.mkdir(parents=True, exist_ok=True)
    node = None
    uri = args.uri
    out_dir, ck = str(work / "totals"), str(work / "checkpoint")
    try:
        if uri is None:
            node, uri = start_hutch(work)
        declare_topology(uri)
        ledger = Ledger.empty()
        if args.backlog:
            took = publish_orders(uri, args.orders, 0, ledger)
            print(f"backlog: published {args.orders} orders in {took:.1f} s before starting the pipeline")
            args.orders, args.no_interrupt = 0, True
        spark = spark_session(verbose=args.verbose)
        query = start(spark, uri, out_dir, ck)
        half = args.orders // 2
        t0 = time.monotonic()
        publisher = threading.Thread(target=lambda: [
            publish_orders(uri, half, args.rate, ledger),
            publish_orders(uri, args.orders - half, args.rate, ledger, first=half)])
        publisher.start()
        if not args.no_interrupt:
            while ledger.published < half and publisher.is_alive():
                time.sleep(0.2)
            query.stop()
            print(f"pipeline stopped after {ledger.published} orders were published; restarting it from "
                  "its checkpoint")
            query = start(spark, uri, out_dir, ck)
        publisher.join()
        published_s = time.monotonic() - t0
        if not args.backlog:
            achieved = ledger.published / published_s
            print(f"published {ledger.published} orders in {published_s:.1f} s "
                  f"({achieved:.0f}/s), every one confirmed")
            if args.rate and achieved < args.rate * 0.95:
                print(f"WARNING: --rate {args.rate:.0f} asked for {args.rate:.0f} orders/s but the publisher "
                      f"reached {achieved:.0f}/s ({achieved / args.rate:.0%}): it waits for each confirm, and "
                      f"it, hutch and Spark share this machine's {os.cpu_count()} CPUs")
        while ready(uri, ORDERS_QUEUE) > 0 or (
                args.backlog and sum(p["numInputRows"] for p in query.recentProgress) < ledger.published):
            time.sleep(0.2)
        drained_s = time.monotonic() - t0
        if args.backlog:
            print(f"the pipeline consumed the backlog of {ledger.published} orders in {drained_s:.1f} s "
                  f"({ledger.published / drained_s:.0f} orders/s, Spark start-up excluded)")
        publish_watermark_tick(uri, 60)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (counted_orders(spark, out_dir) < ledger.published
                                               or ready(uri, TOTALS_AUDIT_QUEUE) < totals_written(spark, out_dir)):
            time.sleep(1.0)  # a micro-batch writes Parquet first, then the exchange: stop after both
        closed_s = time.monotonic() - t0
        query.stop()
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        if not args.backlog:
            print(f"the pipeline had consumed every order {drained_s - published_s:.1f} s after the last "
                  "publish")
        print(f"all windows written {closed_s:.1f} s after the pipeline started")
        print(f"  (last run of the query: {rows} messages in {len(query.recentProgress)} micro-batches)")
        ok = check(spark, out_dir, ledger, uri)
        print("OK: every confirmed order is counted exactly once" if ok else "FAILED")
        spark.stop()
        raise SystemExit(0 if ok else 1)
    finally:
        stop_and_clean(node, work, keep=args.work is not None)


if __name__ == "__main__":
    pika.BasicProperties  # noqa: B018 - pika is a requirement of the example
    main()
