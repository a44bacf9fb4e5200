"""Stream replication: every chunk through a Raft log, or chunks shipped from the segment files (what
hutch does, docs/streams.md "Replication"). One process, 3 members, real disk, same event loop.

- `raft`: 3 `RaftDriver`s (benchmarks/raft_bench.py's loopback cluster, msgpack on every hop); each
  chunk is one proposal; the state machine on every member appends the applied entry to its stream's
  `StreamHandle` (so the chunk is written twice per member: Raft WAL, then segment).
- `direct`: 3 `ReplicatedStream`s (runtime/queue_types/stream_replication/member.py) linked in memory
  (msgpack on every hop too); the writer appends the chunk once, replicas append it as shipped.

Closed loop: `--inflight` publishers each append one chunk of one `--payload`-byte entry and wait until
it is committed (Raft: applied on the leader; direct: settled, i.e. on a majority's disk). Figures:
committed chunks/s, bytes written to files per chunk (all 3 members), fdatasync+fsync calls per chunk.

    .venv/bin/python benchmarks/stream_replication.py --duration 5 --inflight 32 --payload 1024
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from raft_bench import Cluster as RaftCluster  # noqa: E402
from raft_bench import CountingFS, NoOp, until  # noqa: E402

from hutch.cluster import stream_coordinator as sc  # noqa: E402
from hutch.cluster import stream_replica as sr  # noqa: E402
from hutch.runtime.clock import SystemClock  # noqa: E402
from hutch.runtime.clustering.raft_driver import RaftDriver  # noqa: E402
from hutch.runtime.queue_types.stream.handle import StreamHandle  # noqa: E402
from hutch.runtime.queue_types.stream_replication.member import ReplicatedStream  # noqa: E402
from hutch.storage.fs import FileHandle  # noqa: E402


class ByteCountingFS(CountingFS):
    """CountingFS that also counts the bytes written to files."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self._wlock = threading.Lock()

    def _wrote(self, n: int) -> None:
        with self._wlock:
            self.written += n

    def open_append(self, path: str) -> FileHandle:
        return _Counted(super().open_append(path), self._wrote)


class _Counted:
    """A file handle that reports how many bytes go through `write`."""

    def __init__(self, inner: FileHandle, wrote: Callable[[int], None]) -> None:
        self.inner, self.wrote, self.path = inner, wrote, inner.path

    def write(self, data: Any) -> None:
        self.wrote(len(data))
        self.inner.write(data)

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()


class StreamMachine(NoOp):
    """The Raft path's state machine: every applied entry becomes one chunk of this member's stream."""

    def __init__(self, handle: StreamHandle) -> None:
        self.handle = handle

    def apply(self, index: int, data: bytes) -> None:
        self.handle.append([data])


async def closed_loop(publish: Callable[[], Any], inflight: int, duration: float) -> int:
    done = 0
    measuring = stop = False

    async def client() -> None:
        nonlocal done
        while not stop:
            await publish()
            if measuring:
                done += 1
    tasks = [asyncio.ensure_future(client()) for _ in range(inflight)]
    await asyncio.sleep(1.0)
    measuring = True
    await asyncio.sleep(duration)
    measuring = False
    stop = True
    await asyncio.gather(*tasks, return_exceptions=True)
    return done


async def bench_raft(root: str, inflight: int, duration: float, payload: int) -> dict[str, Any]:
    c = RaftCluster(root, 1)  # its loopback network and group lookup; the drivers are built here
    fss = {n: ByteCountingFS() for n in (1, 2, 3)}
    for n in (1, 2, 3):
        d = RaftDriver(n, os.path.join(root, f"n{n}"), c.net.sender(n), fs=fss[n])
        await d.start()
        c.net.drivers[n] = d
    handles = {n: await StreamHandle.open(fss[n], os.path.join(root, f"s{n}"), clock=SystemClock())
               for n in (1, 2, 3)}
    for n in (1, 2, 3):
        c.net.drivers[n].open_group(1, StreamMachine(handles[n]), bootstrap_voters=[1, 2, 3])
    c.group(1, 1).campaign()
    await until(lambda: c.group(1, 1).is_leader, 30, "election")
    data = os.urandom(payload)
    g = c.group(1, 1)
    bytes0 = sum(f.written for f in fss.values())
    syncs0 = sum(f.syncs for f in fss.values())
    n = await closed_loop(lambda: g.propose(data, timeout=10), inflight, duration)
    out = {"mode": "raft", "chunks_per_s": round(n / duration),
           "bytes_per_chunk_3_members": round((sum(f.written for f in fss.values()) - bytes0) / max(n, 1)),
           "syncs_per_1000_chunks": round(1000 * (sum(f.syncs for f in fss.values()) - syncs0) / max(n, 1))}
    for h in handles.values():
        await h.close()
    await c.stop()
    return out


class Link:
    def __init__(self, members: dict[str, ReplicatedStream], coord: list[sc.CoordState], me: str) -> None:
        self.members, self.coord, self.me = members, coord, me

    def send(self, peer: str, message: sr.Message) -> None:
        packed = msgpack.packb(_plain(message))  # the cost of a hop, as raft_bench's loopback pays it
        msgpack.unpackb(packed)
        asyncio.get_running_loop().call_soon(self.members[peer].receive, message)

    def to_coordinator(self, effect: sr.Report | sr.Reelect | sr.Stable) -> None:
        self.coord[0] = sc.apply(self.coord[0], sc.command_for(effect))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


async def bench_direct(root: str, inflight: int, duration: float, payload: int) -> dict[str, Any]:
    names = ("n1", "n2", "n3")
    members: dict[str, ReplicatedStream] = {}
    coord = [sc.apply(sc.NONE, sc.Declare(names, "n1"))]
    fss = {n: ByteCountingFS() for n in names}
    for i, n in enumerate(names):
        members[n] = await ReplicatedStream.open(n, fss[n], os.path.join(root, n), Link(members, coord, n),
                                                 clock=SystemClock(), fenced=0, session_base=i << 32)
    for m in members.values():
        m.observe(coord[0].view())
    await until(lambda: members["n1"].member.commit > 0, 30, "the first commit")
    data = os.urandom(payload)
    w = members["n1"]
    bytes0 = sum(f.written for f in fss.values())
    syncs0 = sum(f.syncs for f in fss.values())
    n = await closed_loop(lambda: w.publish([data]).settled, inflight, duration)
    out = {"mode": "direct", "chunks_per_s": round(n / duration),
           "bytes_per_chunk_3_members": round((sum(f.written for f in fss.values()) - bytes0) / max(n, 1)),
           "syncs_per_1000_chunks": round(1000 * (sum(f.syncs for f in fss.values()) - syncs0) / max(n, 1))}
    for m in members.values():
        await m.close()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--inflight", type=int, default=32)
    ap.add_argument("--payload", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    print(json.dumps({"python": platform.python_version(), "cpus": os.cpu_count(),
                      "load": os.getloadavg()[0], "args": vars(args)}))
    for _ in range(args.rounds):
        for bench in (bench_raft, bench_direct):
            with tempfile.TemporaryDirectory(dir=args.dir) as root:
                t0 = time.perf_counter()
                res = await bench(root, args.inflight, args.duration, args.payload)
                res["wall_s"] = round(time.perf_counter() - t0, 1)
                print(json.dumps(res), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
