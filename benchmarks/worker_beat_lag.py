#!/usr/bin/env python3
"""How late a worker answers on a loaded machine: the bound the tests' `workers.heartbeat_timeout` must
clear (docs/scaling.md, "liveness").

A node of 2 workers at nice 19 (as the test suite runs it), a nice-19 publisher into worker 1 (publish +
get, 1 KiB, in a loop), and HOGS busy loops at normal priority (a benchmark's share of the machine). A
probe (nice 19) times a passive queue.declare round trip to worker 1 every 100 ms for SECONDS: the worst
one bounds how late a heartbeat (a timer on the same event loop) is sent. Prints p50, p99, max and the
load average. Run from the repository root, one at a time across the machine:

    flock /tmp/hutch-bench.lock .venv/bin/python benchmarks/worker_beat_lag.py 4 40
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path[:0] = [".", "tests"]

from tests.conftest import start_server  # noqa: E402  (the test harness's node on free ports)
from tests.workers.test_workers import CONFIG, connect  # noqa: E402


def main(hogs: int, seconds: float) -> None:
    os.nice(19)  # the node (its processes inherit it), the publisher and the probe
    info = start_server(Path(tempfile.mkdtemp(prefix="beat-lag")), "--workers", "2", config_text=CONFIG)
    try:
        with connect(info, 1) as conn:
            conn.channel().queue_declare("lag")
        stop = threading.Event()

        def publish() -> None:
            with connect(info, 1) as conn:
                ch = conn.channel()
                while not stop.is_set():
                    ch.basic_publish("", "lag", b"x" * 1024)
                    ch.basic_get("lag", auto_ack=True)

        publisher = threading.Thread(target=publish)
        publisher.start()
        stop_at = time.monotonic() + seconds
        busy = [subprocess.Popen([sys.executable, "-c", f"import time\nwhile time.monotonic() < {stop_at}: pass"],
                                 preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, 0)) for _ in range(hogs)]
        rtts: list[float] = []
        with connect(info, 1) as probe:
            ch = probe.channel()
            while time.monotonic() < stop_at:
                started = time.monotonic()
                ch.queue_declare("lag", passive=True)
                rtts.append(time.monotonic() - started)
                time.sleep(0.1)
        stop.set()
        publisher.join()
        for proc in busy:
            proc.wait()
        rtts.sort()
        with open("/proc/loadavg") as f:
            load = f.read().strip()
        print(f"hogs={hogs} n={len(rtts)} p50={rtts[len(rtts) // 2] * 1000:.0f}ms "
              f"p99={rtts[int(len(rtts) * 0.99)] * 1000:.0f}ms max={rtts[-1] * 1000:.0f}ms loadavg={load}")
    finally:
        info.stop()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4, float(sys.argv[2]) if len(sys.argv) > 2 else 40.0)
