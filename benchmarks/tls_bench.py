"""AMQP over TLS: hutch against RabbitMQ with hutch-perf, 3 alternating rounds (docs/BENCHMARKS.md, "TLS").

Starts one hutch node from `--hutch-src` with a TLS listener (`listeners.ssl.default`, the certificate and
key given), and measures it beside a RabbitMQ already listening for TLS on `--rabbit-port` (5671) with
the same certificate. hutch-perf runs over `amqps://localhost` with `--cacert`. Reports received msg/s,
latency p50/p99 and broker CPU µs per message (utime+stime from /proc over the run).

    python benchmarks/tls_bench.py --cacert ca.pem --cert server.pem --key server.key --rounds 3 --seconds 10
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from node_ports import port_arg, takes_port_zero  # benchmarks/node_ports.py
from rawload import proc_cpu  # benchmarks/rawload.py

from hutch.portfile import wait_for_ports


def rabbit_pid() -> int:
    return int(subprocess.check_output(["pgrep", "-f", "beam.smp"], text=True).split()[0])


def perf(src: str, port: int, cacert: str, seconds: int, pid: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=src)
    before = proc_cpu([pid])
    out = subprocess.run([sys.executable, "-m", "hutch.cli.perf", "--uri", f"amqps://guest:guest@localhost:{port}/%2F",
                          "--cacert", cacert, "-x", "1", "-y", "1", "-s", "16", "-c", "1000", "-q", "1000", "-A", "100",
                          "-z", str(seconds), "--json"], capture_output=True, text=True, env=env, timeout=seconds + 60)
    used = proc_cpu([pid]) - before
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    received = summary["received"]
    lat = summary["latency_us"]
    return {"rate": received / seconds, "p50_ms": lat["p50"] / 1000, "p99_ms": lat["p99"] / 1000,
            "cpu_us": used / max(received, 1) * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hutch-src", default=str(Path(__file__).resolve().parents[1] / "src"))
    ap.add_argument("--cacert", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--rabbit-port", type=int, default=5671)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tls-bench-"))
    port = port_arg(args.hutch_src)  # "0" (then the ports file says which), or a number for an older tree
    (tmp / "hutch.conf").write_text(f"listeners.ssl.default = {port}\nssl_options.cacertfile = {args.cacert}\n"
                                    f"ssl_options.certfile = {args.cert}\nssl_options.keyfile = {args.key}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HUTCH_")}
    env["PYTHONPATH"] = args.hutch_src
    env["HUTCH_WORKERS"] = "1"  # one process (auto, the default, follows the cores)
    server = subprocess.Popen([sys.executable, "-m", "hutch.cli.server", "--config", str(tmp / "hutch.conf"),
                               "--data-dir", str(tmp / "data"), "--amqp-port", port_arg(args.hutch_src),
                               "--management-port", port_arg(args.hutch_src), "--cluster-port",
                               port_arg(args.hutch_src)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        amqps = int(port)
        if takes_port_zero(args.hutch_src):
            amqps = wait_for_ports(tmp / "data", server, 60)["amqps"]
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", amqps), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit("hutch did not listen for TLS") from None
                time.sleep(0.2)
        results: dict[str, list[dict[str, float]]] = {"hutch": [], "rabbitmq": []}
        for r in range(args.rounds):
            order = [("hutch", amqps, server.pid), ("rabbitmq", args.rabbit_port, rabbit_pid())]
            for name, port, pid in (order if r % 2 == 0 else order[::-1]):
                res = perf(args.hutch_src, port, args.cacert, args.seconds, pid)
                results[name].append(res)
                print(f"round {r + 1} {name}: {json.dumps({k: round(v, 2) for k, v in res.items()})}", flush=True)
                time.sleep(2)
        med = {name: {k: sorted(x[k] for x in runs)[len(runs) // 2] for k in runs[0]} for name, runs in results.items()}
        h, q = med["hutch"], med["rabbitmq"]
        print("| broker | msg/s | broker CPU µs/msg | p50 / p99 ms |\n| --- | ---: | ---: | ---: |")
        for name, m in (("hutch", h), ("RabbitMQ", q)):
            print(f"| {name} | {m['rate']:,.0f} | {m['cpu_us']:.1f} | {m['p50_ms']:.1f} / {m['p99_ms']:.1f} |")
        print(f"| hutch / RabbitMQ | {h['rate'] / q['rate']:.2f}× | {h['cpu_us'] / q['cpu_us']:.2f}× | "
              f"{h['p50_ms'] / q['p50_ms']:.2f}× / {h['p99_ms'] / q['p99_ms']:.2f}× |")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
