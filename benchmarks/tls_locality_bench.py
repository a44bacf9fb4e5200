"""Connection locality for TLS connections (docs/scaling.md, "Connection locality", TLS): what the relay
costs against the hop it saves, and against a moved plain connection.

Usage:
    python benchmarks/tls_locality_bench.py [--tools rawload,perf] [--sizes 16,1000] [--seconds 6]
                                            [--shapes tls-hop,tls-relay,plain-moved,tls-home]

A node of 2 workers (port 0, `--no-cluster`, `workers.own_ports`, AMQP over TLS with a throwaway CA made
by trustme) per locality setting; one queue, homed in worker 0 (the first queue of an empty node: the
fewest-queues placement's tie goes to worker 0; checked through the management API); one publisher
(confirms, window 1000) and one consumer (prefetch 1000, multi-ack 100), both connected to worker 1's own
port, so that their queue is in the other worker:
- `tls-hop`: TLS, `workers.locality = false`: every message crosses the worker link (what a TLS
  connection did before the relay);
- `tls-relay`: TLS, locality on: the connections are served by worker 0 through worker 1's relay;
- `plain-moved`: plain AMQP, locality on: the sockets are handed to worker 0 (no relay);
- `tls-home`: TLS straight to worker 0's own port: neither hop nor relay (the floor).
Generators: rawload (raw frames, `--cacert`) and hutch-perf (`amqps://`, `--cacert`), each unlimited.
Broker CPU is every process of the node (the supervisor and both workers) over the generator's window,
per message received. Prints one JSON line per run. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from base64 import b64encode
from pathlib import Path
from typing import Any

from workers_bench import HERE, cpu_seconds, running  # benchmarks/workers_bench.py

from hutch import portfile


def make_ca(directory: Path) -> tuple[Path, Path, Path]:
    import trustme  # a test dependency; only this benchmark needs it

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    ca.cert_pem.write_to_path(str(paths[0]))
    cert.cert_chain_pems[0].write_to_path(str(paths[1]))
    cert.private_key_pem.write_to_path(str(paths[2]))
    return paths


def api(mgmt_port: int, path: str, method: str = "GET") -> Any:  # Any: the JSON answer
    req = urllib.request.Request(f"http://127.0.0.1:{mgmt_port}{path}", method=method)
    req.add_header("Authorization", "Basic " + b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
    return json.loads(body) if body.strip() else None


def queue_worker(mgmt_port: int, name: str) -> int | None:
    worker = api(mgmt_port, f"/api/queues/%2F/{name}").get("worker")
    return int(worker) if worker is not None else None


def queue_names(mgmt_port: int) -> list[str]:
    return [q["name"] for q in api(mgmt_port, "/api/queues")]


def rawload(port: int, cacert: str | None, pids: list[int], size: int, seconds: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, str(HERE / "rawload.py"), "--port", str(port), "--pids",
                          ",".join(map(str, pids)), *(("--cacert", cacert) if cacert else ()), "-x", "1", "-y", "1",
                          "-s", str(size), "-c", "1000", "-q", "1000", "-A", "100", "-z", str(seconds),
                          "--warmup", "2"], capture_output=True, text=True, timeout=seconds + 90)
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
    doc: dict[str, Any] = json.loads(line)
    latency = doc.get("latency_us") or {}
    return {"receive_rate": doc.get("receive_rate"), "broker_cpu_us_per_msg": doc.get("broker_cpu_us_per_msg"),
            "p50_ms": _ms(latency.get("p50")), "p99_ms": _ms(latency.get("p99")),
            "errors": doc.get("errors") or (out.stderr[-300:] if out.returncode else "")}


def perf(port: int, cacert: str | None, pids: list[int], size: int, seconds: int, queue: str) -> dict[str, Any]:
    scheme = "amqps" if cacert else "amqp"
    cmd = [sys.executable, "-m", "hutch.cli.perf", "--uri", f"{scheme}://guest:guest@127.0.0.1:{port}/%2F",
           *(("--cacert", cacert) if cacert else ()), "-u", queue, "-x", "1", "-y", "1", "-s", str(size),
           "-c", "1000", "-q", "1000", "-A", "100", "-z", str(seconds), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3.0)  # its connections set up (and moved), the run under way: the middle of it is measured
    cpu0, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(max(1.0, seconds - 4.0))
    cpu, took = cpu_seconds(pids) - cpu0, time.monotonic() - t0
    stdout, stderr = proc.communicate(timeout=seconds + 90)
    lines = [json.loads(x) for x in stdout.splitlines() if x.startswith("{")]
    summary = lines[-1] if lines else {}
    rate = summary.get("receive_rate") or 0
    latency = summary.get("latency_us") or {}
    return {"receive_rate": rate, "broker_cpu_us_per_msg": round(1e6 * cpu / (rate * took), 2) if rate else None,
            "p50_ms": _ms(latency.get("p50")), "p99_ms": _ms(latency.get("p99")),
            "errors": stderr[-300:] if proc.returncode else ""}


def _ms(us: float | None) -> float | None:
    return round(us / 1000, 2) if us is not None else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default="rawload,perf")
    ap.add_argument("--sizes", default="16,1000")
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--shapes", default="tls-hop,tls-relay,plain-moved,tls-home")
    args = ap.parse_args()
    shapes = args.shapes.split(",")
    for locality in (False, True):
        wanted = [s for s in shapes if (s == "tls-hop") != locality]
        if not wanted:
            continue
        with tempfile.TemporaryDirectory(prefix="hutch-tls-locality-") as tmp:
            root = Path(tmp)
            cacert, cert, key = make_ca(root)
            conf = root / "node.conf"
            conf.write_text(f"workers.locality = {'true' if locality else 'false'}\nworkers.own_ports = true\n"
                            f"ssl_options.cacertfile = {cacert}\nssl_options.certfile = {cert}\n"
                            f"ssl_options.keyfile = {key}\n")
            data = root / "data"
            data.mkdir()
            with running(data, 2, locality, ("--config", str(conf), "--amqps-port", "0")) as (ports, pids):
                own = [portfile.read(data / f"w{i}") for i in (0, 1)]
                assert own[0] is not None and own[1] is not None
                for shape in wanted:
                    tls = shape != "plain-moved"
                    worker = 0 if shape == "tls-home" else 1
                    port = int(own[worker]["listeners"][("amqps_w" if tls else "amqp_w") + str(worker)])
                    for size in (int(s) for s in args.sizes.split(",")):
                        for tool in args.tools.split(","):
                            assert not queue_names(ports["management"]), "a queue left: the placement would differ"
                            if tool == "rawload":
                                result = rawload(port, str(cacert) if tls else None, pids, size, args.seconds)
                            else:
                                queue = f"tls-bench-{shape}-{size}"
                                result = perf(port, str(cacert) if tls else None, pids, size, args.seconds, queue)
                                result["queue_worker"] = queue_worker(ports["management"], queue)
                                api(ports["management"], f"/api/queues/%2F/{queue}", "DELETE")
                            print(json.dumps({"shape": shape, "tool": tool, "size": size, "locality": locality,
                                              "time": time.strftime("%H:%M:%S"), "loadavg": os.getloadavg(),
                                              **result}), flush=True)


if __name__ == "__main__":
    main()
