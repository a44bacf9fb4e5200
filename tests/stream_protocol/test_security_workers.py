"""The stream protocol at an attacker's sizes on a node of two workers (issue 15's review,
docs/security.md "Stream protocol"): subscriptions in one worker to a stream whose copy is the other's
read it through the worker link; a client that gives the most credit and never reads must not make either
worker hold the stream for it."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import ServerInfo, start_server
from tests.mgmt.helpers import StallProbe, wait_for
from tests.mgmt.sockets import assert_kept_answering
from tests.workers.test_workers import worker_pid

from hutch.queues.stream import chunk as ck
from hutch.streamproto import commands as sc
from hutch.streamproto.codes import OffsetType
from hutch.streamproto.wire import OffsetSpec

from .hostile import RawStream, rss_bytes

CONFIG = "workers.own_ports = true\nworkers.locality = false\n"  # (subscriptions stay where they are made)
CHUNK_BODY = b"\x00Su\xb0" + (60_000).to_bytes(4, "big") + b"x" * 60_000  # 16 a chunk: ~1 MB chunks


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerInfo]:
    info = start_server(tmp_path, "--workers", "2", "--stream-port", "0", config_text=CONFIG)
    yield info
    info.stop()


def test_subscriptions_read_through_the_worker_link_by_a_client_that_never_reads(node: ServerInfo) -> None:
    """A stream of 20 publishes of ~1 MB in worker 0; in worker 1 one connection with 64 subscriptions to it,
    credit 65,535 each, that reads nothing. Before, worker 1 gave the home the client's whole credit, and
    the home sent every chunk for every subscription (1.3 GB here); with 4 connections of 64 on 100 chunks
    worker 1 stalled 11.8 s. Now the home gets credit for at most 4 chunks a subscription and 16 a
    connection ahead of the client's socket. A client reading in worker 1 gets the whole stream."""
    writer = RawStream(node.ports["stream_w0"])
    writer.create("far")
    writer.ok(sc.DeclarePublisher(writer.next_corr(), 1, "", "far"))
    for i in range(20):
        writer.send(sc.Publish(1, [sc.PublishedEntry(i * 16 + j, CHUNK_BODY) for j in range(16)]))
    confirmed = 0
    while confirmed < 320:
        (answer,) = writer.receive()
        assert isinstance(answer, sc.PublishConfirm), answer
        confirmed += len(answer.publishing_ids)
    pids = [worker_pid(node, 0), worker_pid(node, 1)]
    assert None not in pids
    before = [rss_bytes(pid) for pid in pids if pid is not None]
    probe = StallProbe(node.ports["amqp_w1"]).start()
    try:
        hog = RawStream(node.ports["stream_w1"])
        hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.send(*(sc.Subscribe(hog.next_corr(), sid, "far", OffsetSpec(OffsetType.FIRST), 65_535, {})
                   for sid in range(64)))
        reader = RawStream(node.ports["stream_w1"])
        reader.subscribe(1, "far", 100)
        records = 0
        while records < 320:
            (delivery,) = reader.receive()
            assert isinstance(delivery, sc.Deliver), delivery
            records += ck.decode_header(delivery.chunk).num_records
        wait_for(lambda: probe.rounds > 20, timeout=30)
        after = [rss_bytes(pid) for pid in pids if pid is not None]
    finally:
        probe.stop()
    assert_kept_answering(probe)
    assert all(a - b < 300 << 20 for a, b in zip(after, before, strict=True)), (before, after)
