"""A hutch cluster of N nodes on loopback for the stream-protocol benchmarks (issue 23, 3-node figures).

    python benchmarks/stream_cluster.py start --dir DIR [--nodes 3]
    python benchmarks/stream_cluster.py stop --dir DIR

`start` starts N `hutch-server` processes (tests/cluster/nodes.py's `Cluster`: n1 founds the cluster,
n2..nN join it; every listener on port 0, the stream listener included), waits until each has reported
its ports, writes `DIR/cluster.json` ({"nodes": [{"name", "pid", "stream", "amqp", "management"}, ...]})
and leaves the nodes running; `stop` sends them SIGTERM and waits (only to a pid whose command line
still names DIR: an exited node's pid may be another process's by then). A stream created over the stream
protocol on n1 (as benchmarks/stream_rawload.py and stream_rstream.py do) gets every node as a member
and n1 as its writer (the default leader locator, `client-local`): publish with confirms to the leader,
confirmed once two of the three members have the chunk on disk (docs/streams.md, "Replication").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.cluster.nodes import Cluster  # noqa: E402

from hutch import portfile  # noqa: E402

CONFIG = "stream.listeners.tcp.default = 0\n"


def start(directory: Path, nodes: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(directory)
    for _ in range(nodes):
        cluster.add(config_text=CONFIG)
    listed = []
    for node in cluster.nodes:
        doc = portfile.read(node.directory / "data")
        assert doc is not None and node.proc is not None
        listed.append({"name": node.full_name, "pid": node.proc.pid, "stream": doc["listeners"]["stream"],
                       "amqp": node.amqp_port, "management": node.management_port})
    (directory / "cluster.json").write_text(json.dumps({"nodes": listed}, indent=1))
    print(json.dumps({"nodes": listed}))


def is_node(pid: int, directory: Path) -> bool:
    """Whether `pid` is still one of this cluster's nodes (its command line names the cluster's
    directory): a pid of a node that has exited may already be another process's."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(str(directory.resolve()).encode() in arg for arg in cmdline)


def stop(directory: Path) -> None:
    nodes = json.loads((directory / "cluster.json").read_text())["nodes"]
    for node in nodes:
        if is_node(node["pid"], directory):
            os.kill(node["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 30
    for node in nodes:
        while time.monotonic() < deadline and is_node(node["pid"], directory):
            time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["start", "stop"])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args()
    start(args.dir, args.nodes) if args.command == "start" else stop(args.dir)


if __name__ == "__main__":
    main()
