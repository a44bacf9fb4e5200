"""Where streams are, as the stream protocol answers it: the `metadata` command, and the queries about a
replicated stream of which this node is not a member.

Owns: `placement` (a stream's leader and replicas as broker references, pure), `metadata` (the answer to
the command, asked of the members when a stream is another node's), and `query_elsewhere` (query offset
and query publisher sequence of another node's stream, answered by a member).

Rules:
- Every node answers for every stream, as RabbitMQ does (its stream coordinator is cluster-wide): on a
  member from its own view of the stream's group; on a node that is not a member, the stream's writer as
  a member names it (`StreamCatalog.locate`, a `StreamLookup` record) and each member's listener, so a
  client that connects to any node finds the stream's writer and replicas. Until a member answers, the
  connection reads no further command (its answers keep their order); at most `LOOKUPS_AT_ONCE`
  streams are asked at a time.
- This node is broker reference 0. A node of workers is one node outside: its workers are all reference
  0 (docs/scaling.md), and a reference is named once among the replicas, never the leader's again.
- A stream with no writer known (an election, no member reachable) is STREAM_NOT_AVAILABLE, one that does
  not exist STREAM_DOES_NOT_EXIST, one the user may neither read nor write ACCESS_REFUSED.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from hutch.runtime.stream_session.ports import Members, StreamSession
from hutch.runtime.workers.spec import node_of_worker
from hutch.streamproto import commands as c
from hutch.streamproto.codes import Code

Entry = tuple[str, int, int, list[int]]  # stream, response code, leader reference, replica references
NO_BROKER = 0xFFFF
LOOKUPS_AT_ONCE = 32  # another node's streams asked of their members at once, per metadata command


def placement(stream: str, members: Members | None, brokers: dict[tuple[str, int], int]) -> Entry:
    """A stream's leader (its writer's node) and replicas (the other members whose listener is known), as
    references into `brokers` (host and port -> reference; this node is 0, new ones are added); a stream
    of this node only (`members` None): this node, no replicas."""
    if members is None:
        return stream, Code.OK, 0, []
    here, writer, nodes = members
    refs: dict[str, int] = {}
    for node, endpoint in nodes:
        if node_of_worker(node) == node_of_worker(here):
            refs[node] = 0
        elif endpoint is not None:
            refs[node] = brokers.setdefault(endpoint, len(brokers))
    if writer is None or writer not in refs:
        return stream, Code.STREAM_NOT_AVAILABLE, NO_BROKER, []
    leader = refs[writer]
    return stream, Code.OK, leader, [r for r in dict.fromkeys(refs.values()) if r != leader]


def metadata(conn: StreamSession, cmd: c.Metadata) -> None:
    """Answer `cmd`: at once when every stream is this node's (or unknown), else once the members of the
    other nodes' streams named their writers."""
    vhost = conn.vhost.name
    streams = list(dict.fromkeys(cmd.streams))
    far = [s for s in streams if conn.catalog.lookup(vhost, s) is None and conn.catalog.elsewhere(vhost, s)]
    if not far:
        _answer(conn, cmd.correlation_id, streams, {})
        return
    conn.hold_reading("request")

    async def run() -> None:
        found: dict[str, Members | None] = {}
        for start in range(0, len(far), LOOKUPS_AT_ONCE):  # (a metadata may name thousands of streams)
            part = far[start:start + LOOKUPS_AT_ONCE]
            found.update(zip(part, await asyncio.gather(*(conn.catalog.locate(vhost, s) for s in part)), strict=True))
        _answer(conn, cmd.correlation_id, streams, found)
        conn.release_reading("request")
        conn.flush()

    asyncio.ensure_future(run())


def _answer(conn: StreamSession, correlation_id: int, streams: list[str], far: dict[str, Members | None]) -> None:
    brokers: dict[tuple[str, int], int] = {conn.advertised(): 0}  # this node is reference 0
    entries: list[Entry] = []
    vhost = conn.vhost.name
    for stream in streams:
        members = far[stream] if stream in far else conn.catalog.members(vhost, stream)
        if stream in far and members is None or stream not in far and conn.catalog.lookup(vhost, stream) is None:
            entries.append((stream, Code.STREAM_DOES_NOT_EXIST, NO_BROKER, []))
        elif not conn.permitted("read", stream) and not conn.permitted("write", stream):
            entries.append((stream, Code.ACCESS_REFUSED, NO_BROKER, []))
        else:
            entries.append(placement(stream, members, brokers))
    conn.send(c.MetadataResponse(correlation_id, [(ref, h, p) for (h, p), ref in brokers.items()], entries))


def query_elsewhere(conn: StreamSession, cmd: c.QueryOffset | c.QueryPublisherSequence,
                    local: Callable[[Any], None]) -> None:
    """Query offset / query publisher sequence: by `local` for a stream of this node, else (another node's
    replicated stream) as a member answers it."""
    vhost = conn.vhost.name
    if conn.catalog.lookup(vhost, cmd.stream) is not None or not conn.catalog.elsewhere(vhost, cmd.stream):
        local(cmd)
        return
    conn.check_permission("read", cmd.stream)
    offset = isinstance(cmd, c.QueryOffset)
    conn.hold_reading("request")

    async def run() -> None:
        answer = await conn.catalog.ask(vhost, cmd.stream, "offset" if offset else "sequence", cmd.reference)
        if offset:
            code = Code.STREAM_NOT_AVAILABLE if answer is None else Code.NO_OFFSET if not answer else Code.OK
            conn.send(c.QueryOffsetResponse(cmd.correlation_id, code, answer[0] if code == Code.OK else 0))
        elif isinstance(answer, int):
            conn.send(c.QueryPublisherSequenceResponse(cmd.correlation_id, Code.OK, answer))
        else:
            conn.send(c.QueryPublisherSequenceResponse(cmd.correlation_id, Code.STREAM_NOT_AVAILABLE, 0))
        conn.release_reading("request")
        conn.flush()

    asyncio.ensure_future(run())


__all__ = ["metadata", "placement", "query_elsewhere"]
