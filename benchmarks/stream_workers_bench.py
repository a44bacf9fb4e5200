"""The stream protocol on a node of workers against one process (docs/scaling.md, "One copy of a stream
per node"): stream_rawload's (or rstream's) confirmed and consumed msg/s and the node's CPU per message.

Usage:
    python benchmarks/stream_workers_bench.py [--workers 1,2] [--seconds 8] [--size 1000] [--publishers 1]
                                              [--tool rawload|rstream] [--locality on,off]

For each worker count it starts `hutch-server --workers N --no-cluster --stream-port 0` (port 0, a fresh
data directory, `workers.own_ports`) and runs `benchmarks/stream_rawload.py` (publishers with confirms and
one consumer from `first`, each a process) on:
- one process: its stream port;
- N workers: "writer" (the stream created in worker 0, its home and only copy, and every connection
  pinned to worker 0's own port: publishes appended there, reads from its files) and "other" (the stream
  created in worker 0, every connection pinned to worker 1: publishes forwarded to worker 0, chunks
  read there and shipped over the worker link; runtime/stream_session/home_link.py). With connection
  locality on (`--locality on`, the node's default) those connections move to worker 0 at their first
  declare publisher or subscribe; `--locality off` keeps them on the link (one node run per value).
The node's CPU is every process's (the supervisor and each worker) per confirmed message, as stream_rawload
reads it with `--pid`. Prints one JSON line per run. Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from stream_rawload import open_connection, read_frame  # benchmarks/stream_rawload.py
from workers_bench import running  # benchmarks/workers_bench.py

from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code

HERE = Path(__file__).resolve().parent


def create(port: int, stream: str) -> None:
    async def run() -> None:
        reader, writer = await open_connection("127.0.0.1", port, "guest", "guest")
        writer.write(c.encode(c.Create(1, stream, {})))
        reply = await read_frame(reader)
        writer.close()
        assert reply.code in (Code.OK, Code.STREAM_ALREADY_EXISTS), reply
    asyncio.run(run())


def rawload(port: int, stream: str, pids: list[int], args: argparse.Namespace) -> dict[str, object]:
    out = subprocess.run([sys.executable, str(HERE / f"stream_{args.tool}.py"), "--port", str(port), "--stream", stream,
                          "-x", str(args.publishers), "-y", "1", "-s", str(args.size), "-b", "100", "-z",
                          str(args.seconds), "--pid", ",".join(map(str, pids))],
                         check=True, capture_output=True, text=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--size", type=int, default=1000)
    p.add_argument("--publishers", type=int, default=1)
    p.add_argument("--tool", choices=("rawload", "rstream"), default="rawload",
                   help="the load generator: stream_rawload.py, or stream_rstream.py (rstream, the second)")
    p.add_argument("--locality", default="on",
                   help="workers.locality for the nodes of workers: on, off, or on,off (a node run for each)")
    args = p.parse_args()
    for workers in [int(w) for w in args.workers.split(",")]:
        for locality in (args.locality.split(",") if workers > 1 else ["on"]):
            run_node(workers, locality == "on", args)


def run_node(workers: int, locality: bool, args: argparse.Namespace) -> None:
    """One node of `workers` (connection locality on or off) and its runs (the module's list)."""
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "stream-bench.conf"  # (not hutch.conf: running() writes that one)
        conf.write_text(f"workers.own_ports = true\nworkers.locality = {'true' if locality else 'false'}\n")
        with running(Path(tmp) / "data", workers, extra=["--stream-port", "0", "--config", str(conf)]) as (ports, pids):
            runs = [("one process", ports["stream"], ports["stream"])] if workers == 1 else [
                ("writer", ports["stream_w0"], ports["stream_w0"]), ("other", ports["stream_w0"], ports["stream_w1"])]
            for i, (where, create_on, run_on) in enumerate(runs):
                stream = f"bench-{workers}-{i}"
                create(create_on, stream)
                print(json.dumps({"workers": workers, "connections_on": where, "tool": args.tool,
                                  "locality": locality, **rawload(run_on, stream, pids, args)}),
                      flush=True)

if __name__ == "__main__":
    main()
