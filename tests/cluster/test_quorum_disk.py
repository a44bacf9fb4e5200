"""A quorum queue's log on disk stays bounded however much goes through it (issue 7, "bounded resources":
a queue drained to empty leaves no unbounded segment files behind). One node with a 4 MiB WAL, so the
WAL is flushed into segment files many times per round; hutch-perf pushes 1 kB messages through the
queue (producer and consumer at once) in rounds, and the node's Raft directory is measured after each.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from .nodes import FAST, Cluster, eventually

ROUND = 30_000  # messages per round
SIZE = 1000
WAL = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("qq-disk"))
    c.add(config_text=FAST + f"raft.wal_max_size_bytes = {WAL}\n")
    yield c
    c.stop()


def _raft_bytes(data: Path) -> int:
    return sum(f.stat().st_size for f in (data / "cluster" / "raft").rglob("*") if f.is_file())


def test_a_drained_queue_leaves_a_bounded_log(cluster: Cluster) -> None:
    node = cluster[0]
    conn = pika.BlockingConnection(pika.URLParameters(node.url))
    ch = conn.channel()
    ch.queue_declare("drain-qq", durable=True, arguments={"x-queue-type": "quorum"})
    sizes = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-m", "hutch.cli.perf", "--uri", node.url, "-x", "1", "-y", "1",
                              "-s", str(SIZE), "-c", "1000", "-q", "1000", "-A", "100", "-u", "drain-qq",
                              "-C", str(ROUND), "-D", str(ROUND), "--json"],
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, out.stderr[-2000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["received"] == ROUND and result["confirmed"] == ROUND, result
        eventually(lambda: ch.queue_declare("drain-qq", passive=True).method.message_count == 0, timeout=20)
        sizes.append(_raft_bytes(node.directory / "data"))
    pushed = 3 * ROUND * SIZE
    # what stays: at most the WAL, the entries since the last snapshot and half an interval below it
    # (SNAPSHOT_FLOOR = 16,384 messages): about 25 MB here, against 90 MB pushed through
    print("raft directory after each round:", sizes)
    assert max(sizes) < 0.4 * pushed, sizes
    assert sizes[2] <= 1.3 * sizes[0] + WAL, sizes  # no growth from round to round
    conn.close()
