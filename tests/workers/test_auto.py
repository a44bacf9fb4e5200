"""`--workers auto`, the default (runtime/workers/auto.py): what a node of `auto` becomes, with real
`hutch-server` processes. The start log names the choice and why; a data directory keeps its shape; a
node set up for a multi-node cluster (an inter-node port given, `--join`) is one process, so a cluster
formed with the default forms as before; a node of workers joins one with `join_cluster` (tests/cluster/test_workers_cluster.py).

The tests ask for `--workers auto` explicitly (the harness gives every other node `--workers 1`), and
read the machine's usable cores where the answer depends on them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pika
from tests.cluster.nodes import Cluster, short
from tests.conftest import start_server

from hutch import portfile
from hutch.runtime.workers.cores import usable_cores


def auto_choice(log: str) -> tuple[int, str]:
    found = re.search(r"workers auto: (\d+) \((.*)\)", log)
    assert found, log
    return int(found.group(1)), found.group(2)


def test_auto_is_the_usable_cores_on_a_fresh_node_that_is_not_clustered(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--workers", "auto")
    try:
        cores = usable_cores()
        assert auto_choice(server.log()) == (cores, f"{cores} usable core{'s' if cores != 1 else ''}")
        doc = portfile.read(server.data_dir)
        assert doc is not None and doc["pid"] == server.proc.pid
        assert (server.data_dir / "w0").is_dir() == (cores > 1)  # a node of workers keeps w<N>/ each
        with pika.BlockingConnection(pika.URLParameters(server.url)) as conn:
            ch = conn.channel()
            ch.queue_declare("auto-q")
            ch.basic_publish("", "auto-q", b"served")
            assert ch.basic_get("auto-q", auto_ack=True)[2] == b"served"
    finally:
        server.stop()


def test_auto_keeps_a_one_process_nodes_data_in_one_process(tmp_path: Path) -> None:
    lone = start_server(tmp_path, "--workers", "1")
    try:
        with pika.BlockingConnection(pika.URLParameters(lone.url)) as conn:
            conn.channel().queue_declare("kept", durable=True)
    finally:
        lone.stop()
    again = start_server(tmp_path, "--workers", "auto")
    try:
        assert auto_choice(again.log()) == (1, "the data directory holds a one-process node's data")
        with pika.BlockingConnection(pika.URLParameters(again.url)) as conn:
            conn.channel().queue_declare("kept", passive=True)  # its queue is there: not an empty node
    finally:
        again.stop()


def test_a_cluster_formed_with_auto_is_one_process_per_node(tmp_path: Path) -> None:
    """The clustering recipe (docs/clustering.md) with the default: the seed is given its inter-node
    port, the joiner `--join`; both resolve to one process and form a cluster of two."""
    cluster = Cluster(tmp_path)
    try:
        n1 = cluster.add(workers="auto")
        n2 = cluster.add(workers="auto")
        assert auto_choice(n1.log())[0] == 1 and "inter-node port" in auto_choice(n1.log())[1]
        assert auto_choice(n2.log())[0] == 1 and "--join" in auto_choice(n2.log())[1]
        doc = cluster.wait_running({"n1", "n2"})
        assert {short(n) for n in doc["running_nodes"]} == {"n1", "n2"}
    finally:
        cluster.stop()
