"""A super stream's creation is all or nothing across a `kill -9` (runtime/stream_session/super_streams.py,
"Syncs"): its records are one group, durable together by the group's end (one sync of the definitions
log, or one metadata entry on a clustered node). Against a real node, without clustering and as a cluster
of one: creations under way when the node is killed leave, after the restart, either the whole super
stream or nothing of it (no partition stream, no exchange, no stream directory); a creation answered OK
before the kill is whole. The first creation is small, so the others (created one partition a loop turn,
beside it) are under way when it is answered and the node killed; the invariant holds whatever the kill
catches (with a sync per record, as before, they were left half there)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.conftest import start_server

from hutch.streamproto import commands as sc
from hutch.streamproto.codes import Code, Key

from .conftest import StreamServer
from .hostile import RawStream

PARTITIONS = 128
FIRST = 4  # partitions of the first creation, answered while the others are under way
CREATIONS = 4


def partition_names(name: str) -> list[str]:
    return [f"{name}-{i}" for i in range(FIRST if name.endswith("0") else PARTITIONS)]


def state_of(client: RawStream, name: str) -> str:
    """'whole', 'absent', or what is half there."""
    (listed,) = client.request(sc.Partitions(client.next_corr(), name))
    assert isinstance(listed, sc.PartitionsResponse)
    (meta,) = client.request(sc.Metadata(client.next_corr(), partition_names(name)))
    assert isinstance(meta, sc.MetadataResponse)
    streams = sum(1 for _stream, code, _leader, _replicas in meta.streams if code == Code.OK)
    if listed.code == Code.OK and listed.streams == partition_names(name) and streams == len(listed.streams):
        return "whole"
    if listed.code == Code.STREAM_DOES_NOT_EXIST and streams == 0:
        return "absent"
    return f"half: partitions {listed.code} {len(listed.streams)} bound, {streams} streams"


def stream_dirs(data_dir: Path) -> int:
    """Stream directories of the node (a node of workers keeps them under each worker's w<N>/)."""
    return len(list(data_dir.glob("streams/*"))) + len(list(data_dir.glob("w*/streams/*")))


@pytest.mark.parametrize("cluster", [False, True], ids=["no-cluster", "cluster-of-one"])
def test_creations_killed_midway_leave_whole_super_streams_or_none(tmp_path: Path, cluster: bool) -> None:
    """Without clustering the records are one group of the definitions log; on a cluster of one (a node's
    default, and a node of workers) one metadata entry proposed at the creation's end."""
    info = start_server(tmp_path, "--stream-port", "0", cluster=cluster)
    server = StreamServer(tmp_path, info.ports["stream"], info)
    try:
        check_creations_killed_midway(server, cluster)
    finally:
        server.info.stop()


def check_creations_killed_midway(server: StreamServer, cluster: bool) -> None:
    clients = [RawStream(server.port) for _ in range(CREATIONS)]
    names = [f"crash{k}" for k in range(CREATIONS)]
    for client, name in zip(clients, names, strict=True):
        parts = partition_names(name)
        client.send(sc.CreateSuperStream(client.next_corr(), name, parts, [str(i) for i in range(len(parts))], {}))
    (first,) = clients[0].receive()  # the others are under way, or done
    assert first == sc.Response(Key.CREATE_SUPER_STREAM, clients[0].corr, Code.OK), first
    server.info.stop(signal.SIGKILL)
    for client in clients:
        client.close()
    server.info = start_server(server.tmp, "--stream-port", str(server.port), cluster=cluster)
    check = RawStream(server.port)
    try:
        states = {name: state_of(check, name) for name in names}
    finally:
        check.close()
    assert states[names[0]] == "whole", states
    assert set(states.values()) <= {"whole", "absent"}, states
    assert stream_dirs(server.info.data_dir) == sum(len(partition_names(name)) for name, s in states.items()
                                                    if s == "whole")  # orphans of the others removed
