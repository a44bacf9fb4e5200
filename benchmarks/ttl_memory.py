"""100,000 messages with a 1-second TTL and no consumer: does the broker's memory return to its baseline?

    python benchmarks/ttl_memory.py --port 5673 --pid PID [--count 100000] [--size 100] [--label hutch]

Reads the broker's RSS (/proc/PID/status) before publishing, right after publishing (hutch-perf -x 1 -y 0
-C COUNT with confirms into a fresh queue declared with x-message-ttl=1000), then every 0.5 s for 10 s,
and prints one JSON line: baseline, peak, final RSS, and the queue length at the end (0 when every message
expired without a consumer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pika


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True, help="the broker's process id")
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--label", default="broker")
    args = ap.parse_args()
    queue = f"ttl-memory-{int(time.time())}"
    conn = pika.BlockingConnection(pika.ConnectionParameters(port=args.port))
    ch = conn.channel()
    ch.queue_declare(queue, arguments={"x-message-ttl": 1000})
    time.sleep(1.0)
    baseline = rss_mib(args.pid)
    perf = Path(sys.executable).with_name("hutch-perf")
    subprocess.run([str(perf), "--uri", f"amqp://guest:guest@127.0.0.1:{args.port}/%2F", "-x", "1", "-y", "0",
                    "-s", str(args.size), "-c", "1000", "-C", str(args.count), "-u", queue, "-z", "120"],
                   check=True, capture_output=True)
    after_publish = rss_mib(args.pid)
    peak = after_publish
    samples = []
    for _ in range(20):
        time.sleep(0.5)
        value = rss_mib(args.pid)
        samples.append(round(value, 1))
        peak = max(peak, value)
    left = ch.queue_declare(queue, passive=True).method.message_count
    ch.queue_delete(queue)
    conn.close()
    print(json.dumps({"broker": args.label, "scenario": "ttl_1s_no_consumer", "count": args.count,
                      "size_bytes": args.size, "rss_baseline_mib": round(baseline, 1),
                      "rss_after_publish_mib": round(after_publish, 1), "rss_peak_mib": round(peak, 1),
                      "rss_final_mib": samples[-1], "rss_samples_mib": samples, "queue_left": left}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
