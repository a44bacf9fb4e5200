"""Attach at `first` to a large stream over AMQP 0-9-1 (pika): time to the first message, read rate, broker RSS.

Usage:
    python benchmarks/stream_attach.py --port PORT --pid BROKER_PID --queue NAME --messages N [--delete]

The stream `NAME` holds at least N messages already (fill it with e.g. `hutch-perf -u NAME -x 1 -y 0 -c 1000
-s 100 -C N`). One consumer (prefetch `--prefetch`, acking every half prefetch)
attaches with `x-stream-offset: first` and reads N messages (the stream may hold more: without `--delete`
the script then drops its connection rather than cancel, see the end of `main`); the broker's RSS (/proc/PID/status, VmRSS; for
RabbitMQ pass the beam.smp pid) is sampled every 50 ms. Prints one JSON line. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

import pika


class ReadEnough(Exception):
    """The consumer has read `--messages` messages."""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--queue", required=True)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--prefetch", type=int, default=1000)
    ap.add_argument("--delete", action="store_true", help="delete the stream at the end")
    args = ap.parse_args()
    params = pika.ConnectionParameters(args.host, args.port, credentials=pika.PlainCredentials("guest", "guest"))
    out: dict[str, object] = {"queue": args.queue, "messages": args.messages}
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_declare(args.queue, durable=True, arguments={"x-queue-type": "stream"})
    peak = [rss_mib(args.pid)]
    out["rss_before_mib"] = round(peak[0], 1)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss_mib(args.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ch.basic_qos(prefetch_count=args.prefetch)
    got = 0
    first_at = 0.0
    half = max(1, args.prefetch // 2)
    started = time.perf_counter()

    def on_message(c: object, method: object, props: object, body: bytes) -> None:
        nonlocal got, first_at
        got += 1
        if got == 1:
            first_at = time.perf_counter() - started
        if got % half == 0 or got == args.messages:
            ch.basic_ack(method.delivery_tag, multiple=True)  # type: ignore[attr-defined]
        if got >= args.messages:
            raise ReadEnough

    ch.basic_consume(args.queue, on_message, arguments={"x-stream-offset": "first"})
    try:
        ch.start_consuming()
    except ReadEnough:
        pass
    elapsed = time.perf_counter() - started
    stop.set()
    sampler.join()
    out.update({"first_message_ms": round(first_at * 1000, 1), "read_s": round(elapsed, 1),
                "read_rate": round(got / elapsed), "rss_peak_mib": round(peak[0], 1)})
    if not args.delete:
        # cancelling would make pika reject the deliveries it holds, which a stream refuses (540, on both
        # brokers): drop the connection instead
        print(json.dumps(out), flush=True)
        os._exit(0)
    ch.queue_delete(args.queue)
    conn.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
