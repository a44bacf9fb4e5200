"""Attach at `first` to a large stream over AMQP 0-9-1 (pika): time to the first message, read rate, broker RSS.

Usage:
    python benchmarks/stream_attach.py --port PORT --pid BROKER_PID --queue NAME --messages N [--delete]

The stream `NAME` holds at least N messages already (fill it with e.g. `hutch-perf -u NAME -x 1 -y 0 -c 1000
-s 100 -C N`). One consumer (prefetch `--prefetch`, acking every half prefetch)
attaches with `x-stream-offset: first` and reads N messages; the broker's RSS (/proc/PID/status, VmRSS; for
RabbitMQ pass the beam.smp pid) is sampled every 50 ms. Prints one JSON line. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import pika


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
            ch.stop_consuming()

    ch.basic_consume(args.queue, on_message, arguments={"x-stream-offset": "first"})
    ch.start_consuming()
    elapsed = time.perf_counter() - started
    stop.set()
    sampler.join()
    out.update({"first_message_ms": round(first_at * 1000, 1), "read_s": round(elapsed, 1),
                "read_rate": round(got / elapsed), "rss_peak_mib": round(peak[0], 1)})
    if args.delete:
        ch.queue_delete(args.queue)
    conn.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
