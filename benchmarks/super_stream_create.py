"""Creating super streams of 128 partitions on a real hutch-server: time to answer, loop stall, syncs.

    python benchmarks/super_stream_create.py [creations] [--src DIR] [--strace] [--cluster]

Starts a hutch-server on free ports in a temporary directory (`--src`: the `src` directory of another
tree, e.g. `git archive main src | tar -x -C /tmp/main`, to measure it the same way), opens `creations`
(default 8) stream connections and sends each a `create_super_stream` of 128 partitions at once, with
the AMQP stall probe beside them (tests/mgmt/helpers.StallProbe: a passive queue.declare every 20 ms;
its longest round trip is the loop's stall). Prints when the first and the last answer came, the stall,
and with `--strace` the fsync/fdatasync calls the node made (`strace -c -f` on it). The node is started
with --no-cluster (definitions in the definitions log), or with `--cluster` as a cluster of one (a
node's default: definitions in the metadata Raft group). docs/streams.md
("Super streams") quotes it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]
from tests.mgmt.helpers import StallProbe  # noqa: E402
from tests.stream_protocol.hostile import RawStream  # noqa: E402

from conftest import start_server  # noqa: E402
from hutch.streamproto import commands as sc  # noqa: E402
from hutch.streamproto.codes import Code  # noqa: E402

PARTITIONS = 128


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("creations", type=int, nargs="?", default=8)
    ap.add_argument("--src", help="the src directory of the tree to run (default: this one)")
    ap.add_argument("--strace", action="store_true", help="count the node's syncs with strace -c")
    ap.add_argument("--cluster", action="store_true", help="a cluster of one (else --no-cluster)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="super-stream-bench-") as tmp:
        env = {"PYTHONPATH": args.src} if args.src else None
        info = start_server(Path(tmp), "--stream-port", "0", env=env, cluster=args.cluster)
        tracer = None
        try:
            if args.strace:
                tracer = subprocess.Popen(["strace", "-f", "-c", "-e", "trace=fsync,fdatasync",
                                           "-p", str(info.proc.pid), "-o", f"{tmp}/strace.txt"])
                time.sleep(1)
            clients = [RawStream(info.ports["stream"]) for _ in range(args.creations)]
            probe = StallProbe(info.amqp_port).start()
            started = time.monotonic()
            for k, c in enumerate(clients):
                c.send(sc.CreateSuperStream(c.next_corr(), f"bench{k}", [f"bench{k}-{i}" for i in range(PARTITIONS)],
                                            [str(i) for i in range(PARTITIONS)], {}))
            answered = []
            for c in clients:
                (answer,) = c.receive(timeout=300)
                assert isinstance(answer, sc.Response) and answer.code == Code.OK, answer
                answered.append(time.monotonic() - started)
            probe.stop()
            if tracer is not None:
                tracer.terminate()
                tracer.wait()
                print(Path(f"{tmp}/strace.txt").read_text().rstrip())
            print(f"{args.creations} creations of {PARTITIONS} partitions: first answered {min(answered):.2f} s, "
                  f"all {max(answered):.2f} s; stall {probe.longest_s * 1000:.0f} ms ({probe.rounds} probes); "
                  f"load average {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        finally:
            info.stop()


if __name__ == "__main__":
    main()
