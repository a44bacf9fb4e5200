"""Streams on three nodes, hutch against RabbitMQ 3.10.8, in one sitting (issue 23: "1 node and 3 nodes").

    python benchmarks/stream_cluster.py start --dir HDIR            # hutch: n1..n3
    sh benchmarks/rabbit_cluster.sh start RDIR                      # RabbitMQ: rmq1..rmq3
    python benchmarks/streams_three_nodes.py run --hutch-cluster-dir HDIR --rabbit-cluster-dir RDIR \\
        --rounds 2 --sizes 16,1000 --protocols stream,amqp --seconds 8 --out results.jsonl
    python benchmarks/streams_three_nodes.py summary --results results.jsonl

Both clusters run on this one machine, so each broker's three nodes share its two cores with the load
generator (what a cluster costs here, not what three machines give). Every run connects to the first
node of each cluster: the stream the generator creates (stream protocol) or declares (AMQP 0-9-1, with
pika) there has that node as its leader (both brokers' default leader locator, client-local) and every
node as a member (hutch's default and RabbitMQ's `x-initial-cluster-size` default), so a publish is
confirmed once a majority of the three has the chunk. The generators and their options are
benchmarks/streams_vs_rabbitmq.py's (two per protocol; CPU is the three nodes' processes summed); the
brokers alternate, hutch first in odd rounds. One JSON line per run in `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from streams_vs_rabbitmq import cli, load_rows, measure, pair_cells, plan  # noqa: E402

RABBIT_AMQP = (5681, 5682, 5683)  # benchmarks/rabbit_cluster.sh's ports
RABBIT_STREAM = (5561, 5562, 5563)


def brokers(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    nodes = json.loads((Path(args.hutch_cluster_dir) / "cluster.json").read_text())["nodes"]
    rabbit_pids = [int((Path(args.rabbit_cluster_dir) / f"rmq{i}" / "pid").read_text()) for i in (1, 2, 3)]
    both = {"hutch-3n": {"stream": nodes[0]["stream"], "amqp": nodes[0]["amqp"], "pids": [n["pid"] for n in nodes]},
            "rabbitmq-3n": {"stream": RABBIT_STREAM[0], "amqp": RABBIT_AMQP[0], "pids": rabbit_pids}}
    return {k: {**v, "pid": ",".join(map(str, v["pids"]))} for k, v in both.items()}


def run(args: argparse.Namespace) -> None:
    both = brokers(args)
    sizes = [int(s) for s in args.sizes.split(",")]
    with open(args.out, "a") as out:
        for rnd in range(args.first_round, args.first_round + args.rounds):
            order = ["hutch-3n", "rabbitmq-3n"] if rnd % 2 else ["rabbitmq-3n", "hutch-3n"]
            for protocol, size, tool in plan(args.protocols.split(","), sizes):
                for broker in order:
                    measure(out, protocol, tool, size, rnd, broker, both[broker], args.seconds, args.label)


def summary(args: argparse.Namespace) -> None:
    rows = load_rows(args.results, lambda d: d.get("broker") in ("hutch-3n", "rabbitmq-3n"))
    print("| protocol | size | generator | round | load | hutch pub / cons msg/s | RabbitMQ pub / cons msg/s "
          "| ratio pub / cons | hutch p50 / p99 ms | RabbitMQ p50 / p99 ms | CPU µs/msg hutch / RabbitMQ |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (protocol, size, tool, rnd, _), pair in sorted(rows.items()):
        h, q = pair.get("hutch-3n"), pair.get("rabbitmq-3n")
        if not h or not q:
            continue
        if "error" in h["r"] or "error" in q["r"]:
            which = "hutch" if "error" in h["r"] else "RabbitMQ"
            print(f"| {protocol} | {size} B | {tool} | {rnd} | - | failed on {which}: "
                  f"{(h['r'].get('error') or q['r'].get('error'))[-120:]!r} | | | | | |")
            continue
        print(pair_cells(protocol, size, tool, rnd, h, q))


def _brokers(r: argparse.ArgumentParser) -> None:
    r.add_argument("--hutch-cluster-dir", required=True, help="benchmarks/stream_cluster.py's --dir")
    r.add_argument("--rabbit-cluster-dir", required=True, help="benchmarks/rabbit_cluster.sh's DIR")


if __name__ == "__main__":
    cli(__doc__, 2, _brokers, run, summary)
