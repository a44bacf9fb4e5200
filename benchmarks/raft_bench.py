"""In-process benchmark of the Raft driver (runtime/clustering/raft_driver.py): 3 drivers, one process, real disk.

Three `RaftDriver`s run in one event loop (uvloop if installed), connected by a loopback network that
msgpack-encodes every payload and delivers it with `call_soon`; each driver has its own data directory
under a temporary directory (default: the system temp dir; `--dir` to choose the disk). The state machine
is a no-op. Figures:

- commits/s, fdatasyncs per 1,000 commits and commit latency p50/p99 with 1 group and with 100 groups,
  at several numbers of proposals in flight (closed loop: each client proposes again when its last
  proposal is applied on the leader). fsyncs are counted two ways: the drivers' group commits
  (`RaftDriver.fsyncs`, all 3 nodes) and every fdatasync/fsync the file system wrapper saw (all nodes,
  including directory fsyncs and snapshot files).
- CPU seconds (process time, all threads) over `--idle-seconds` of the process hosting 3 drivers with
  `--idle-groups` idle groups each (leaders spread over the 3 nodes), after they quiesced; and, for
  comparison, the same with quiescence off over `--busy-seconds`.
- time to elect a new leader after the leader's driver is stopped (and the transport reports it down),
  with the default timing (tick 100 ms, election after 10-20 ticks), over `--elections` trials.

    .venv/bin/python benchmarks/raft_bench.py            # everything (~2.5 min)
    .venv/bin/python benchmarks/raft_bench.py --only commits --duration 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack

from hutch.runtime.clustering.raft_driver import Group, NotLeader, ProposalTimeout, RaftDriver
from hutch.storage.fs import RealFileHandle, RealFS


class CountingFS(RealFS):
    """RealFS counting every fdatasync of a file handle and every directory fsync (from any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.syncs = 0

    def _count(self) -> None:
        with self._lock:
            self.syncs += 1

    def open_append(self, path: str) -> RealFileHandle:
        return _CountedHandle(path, self._count)

    def fsync_dir(self, path: str) -> None:
        self._count()
        super().fsync_dir(path)


class _CountedHandle(RealFileHandle):
    __slots__ = ("_on_sync",)

    def __init__(self, path: str, on_sync: Callable[[], None]) -> None:
        super().__init__(path)
        self._on_sync = on_sync

    def sync(self) -> None:
        self._on_sync()
        super().sync()


class NoOp:
    def apply(self, index: int, data: bytes) -> None:
        return None

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        pass

    def on_membership(self, voters: tuple[int, ...]) -> None:
        pass


class Loopback:
    def __init__(self) -> None:
        self.drivers: dict[int, RaftDriver] = {}
        self.bytes = 0

    def sender(self, src: int) -> Callable[[int, Any], None]:
        loop = asyncio.get_running_loop()

        def send(dst: int, payload: Any) -> None:
            data = msgpack.packb(payload)
            self.bytes += len(data)
            loop.call_soon(self._deliver, src, dst, data)

        return send

    def _deliver(self, src: int, dst: int, data: bytes) -> None:
        d = self.drivers.get(dst)
        if d is not None:
            d.receive(src, msgpack.unpackb(data))

    def kill(self, node: int) -> RaftDriver:
        d = self.drivers.pop(node)
        for other in self.drivers.values():
            other.peer_down(node)
        return d


async def until(cond: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(poll_s)


class Cluster:
    def __init__(self, root: str, groups: int, *, spread: bool = False, **kw: Any) -> None:
        self.root = root
        self.ngroups = groups
        self.spread = spread
        self.kw = kw
        self.net = Loopback()
        self.fs: dict[int, CountingFS] = {}

    async def start(self) -> None:
        ids = [1, 2, 3]
        for n in ids:
            self.fs[n] = CountingFS()
            d = RaftDriver(n, os.path.join(self.root, f"n{n}"), self.net.sender(n), fs=self.fs[n], **self.kw)
            await d.start()
            self.net.drivers[n] = d
        for n in ids:
            for gid in range(1, self.ngroups + 1):
                self.net.drivers[n].open_group(gid, NoOp(), bootstrap_voters=ids)
        for gid in range(1, self.ngroups + 1):
            self.group(self.leader_of(gid), gid).campaign()
            if gid % 500 == 0:
                await asyncio.sleep(0)
        await until(lambda: all(self.group(self.leader_of(g), g).is_leader for g in range(1, self.ngroups + 1)),
                    120, "elections")

    def leader_of(self, gid: int) -> int:
        return (gid - 1) % 3 + 1 if self.spread else 1

    def group(self, node: int, gid: int) -> Group:
        return self.net.drivers[node].groups[gid]

    def quiesced(self) -> bool:
        return all(g.quiesced for d in self.net.drivers.values() for g in d.groups.values())

    def fsyncs(self) -> tuple[int, int, int]:
        """(driver group commits on all nodes, on node 1, fdatasync+fsync calls seen on all nodes)"""
        ds = self.net.drivers
        return sum(d.fsyncs for d in ds.values()), ds[1].fsyncs, sum(f.syncs for f in self.fs.values())

    async def stop(self) -> None:
        for d in list(self.net.drivers.values()):
            await d.stop()


def pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


async def bench_commits(root: str, groups: int, inflight: int, duration: float, payload: int) -> dict[str, Any]:
    c = Cluster(root, groups)
    await c.start()
    data = os.urandom(payload)
    latencies: list[float] = []
    measuring = False
    stop = False
    errors = 0

    async def client(gid: int) -> None:
        nonlocal errors
        g = c.group(1, gid)
        while not stop:
            t0 = time.perf_counter()
            try:
                await g.propose(data, timeout=10)
            except (NotLeader, ProposalTimeout):
                errors += 1
                await asyncio.sleep(0.01)
                continue
            if measuring:
                latencies.append(time.perf_counter() - t0)

    tasks = [asyncio.ensure_future(client(i % groups + 1)) for i in range(inflight)]
    await asyncio.sleep(1.0)  # warm up
    f0 = c.fsyncs()
    cpu0 = time.process_time()
    measuring = True
    t0 = time.perf_counter()
    await asyncio.sleep(duration)
    measuring = False
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    f1 = c.fsyncs()
    stop = True
    await asyncio.gather(*tasks)
    await c.stop()
    n = len(latencies)
    latencies.sort()
    return {
        "bench": "commits", "groups": groups, "inflight": inflight, "payload_bytes": payload,
        "seconds": round(elapsed, 2), "commits": n, "commits_per_s": round(n / elapsed),
        "group_commits_per_1000": round(1000 * (f1[0] - f0[0]) / max(n, 1), 1),
        "leader_group_commits_per_1000": round(1000 * (f1[1] - f0[1]) / max(n, 1), 1),
        "fs_syncs_per_1000": round(1000 * (f1[2] - f0[2]) / max(n, 1), 1),
        "p50_ms": round(pct(latencies, 0.50) * 1000, 2), "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "cpu_s_per_s": round(cpu / elapsed, 2), "errors": errors,
    }


async def bench_idle(root: str, groups: int, seconds: float, quiesce: bool) -> dict[str, Any]:
    t0 = time.perf_counter()
    c = Cluster(root, groups, spread=True, quiesce=quiesce)
    await c.start()
    setup = time.perf_counter() - t0
    if quiesce:
        await until(c.quiesced, 120, "quiescence", poll_s=0.1)
    await asyncio.sleep(2.0)  # let the last answers arrive
    ticks0 = sum(d.ticks for d in c.net.drivers.values())
    sends0 = sum(d.sends for d in c.net.drivers.values())
    bytes0 = c.net.bytes
    cpu0 = time.process_time()
    t1 = time.perf_counter()
    await asyncio.sleep(seconds)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - t1  # more than `seconds` when the loop cannot keep up
    ticks = sum(d.ticks for d in c.net.drivers.values()) - ticks0
    sends = sum(d.sends for d in c.net.drivers.values()) - sends0
    net_bytes = c.net.bytes - bytes0
    await c.stop()
    return {"bench": "idle", "groups_per_driver": groups, "drivers": 3, "quiesce": quiesce,
            "seconds": round(wall, 2), "setup_s": round(setup, 1), "cpu_s": round(cpu, 4),
            "cpu_s_per_driver": round(cpu / 3, 4), "cpu_s_per_s": round(cpu / wall, 4),
            "group_ticks": ticks, "sends": sends, "net_bytes": net_bytes}


async def bench_election(root: str, trials: int, groups: int) -> dict[str, Any]:
    times: list[float] = []
    for trial in range(trials):
        c = Cluster(os.path.join(root, f"t{trial}"), groups)
        await c.start()
        for gid in range(1, groups + 1):
            await c.group(1, gid).propose(b"x")
        await until(c.quiesced, 30, "quiescence", poll_s=0.02)
        elected: dict[int, float] = {}
        for n in (2, 3):
            for gid in range(1, groups + 1):
                g = c.group(n, gid)

                def changed(leader: int, n: int = n, gid: int = gid, elected: dict[int, float] = elected) -> None:
                    if leader == n and gid not in elected:
                        elected[gid] = time.perf_counter()

                g.on_leader_change = changed
        t0 = time.perf_counter()
        await c.net.kill(1).stop(crash=True)
        await until(lambda e=elected: len(e) == groups, 30, "new leaders", poll_s=0.005)  # type: ignore[misc]
        times.append(max(elected.values()) - t0)
        await c.stop()
    times.sort()
    return {"bench": "election", "groups": groups, "trials": trials, "tick_s": 0.1, "election_tick": 10,
            "min_s": round(times[0], 3), "median_s": round(statistics.median(times), 3),
            "max_s": round(times[-1], 3)}


def table(rows: list[dict[str, Any]]) -> str:
    out = []
    commits = [r for r in rows if r["bench"] == "commits"]
    if commits:
        out.append(f"{'groups':>6} {'inflight':>8} {'commits/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
                   f"{'gc/1000':>8} {'leader gc/1000':>14} {'fsyncs/1000':>11} {'cpu/s':>6}")
        for r in commits:
            out.append(f"{r['groups']:>6} {r['inflight']:>8} {r['commits_per_s']:>10} {r['p50_ms']:>8} "
                       f"{r['p99_ms']:>8} {r['group_commits_per_1000']:>8} {r['leader_group_commits_per_1000']:>14} "
                       f"{r['fs_syncs_per_1000']:>11} {r['cpu_s_per_s']:>6}")
        out.append("  (gc = driver group commits, all 3 nodes; fsyncs = every fdatasync/fsync, all 3 nodes)")
    for r in rows:
        if r["bench"] == "idle":
            out.append(f"idle: 3 drivers x {r['groups_per_driver']} groups, quiesce={r['quiesce']}: "
                       f"{r['cpu_s']} CPU s in {r['seconds']} s ({r['cpu_s_per_driver']} per driver, "
                       f"{r['cpu_s_per_s']} CPU s/s), "
                       f"{r['group_ticks']} group ticks, {r['sends']} sends, {r['net_bytes']} bytes "
                       f"(setup {r['setup_s']} s)")
        elif r["bench"] == "election":
            out.append(f"election after the leader's driver stops ({r['groups']} group(s), tick {r['tick_s']} s, "
                       f"election_tick {r['election_tick']}, {r['trials']} trials): min {r['min_s']} s, "
                       f"median {r['median_s']} s, max {r['max_s']} s")
    return "\n".join(out)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    root = tempfile.mkdtemp(prefix="raft-bench-", dir=args.dir)
    rows: list[dict[str, Any]] = []
    try:
        if args.only in (None, "commits"):
            for groups, inflight in ((1, 1), (1, 64), (1, 256), (100, 100), (100, 1000)):
                r = await bench_commits(os.path.join(root, f"c{groups}-{inflight}"), groups, inflight,
                                        args.duration, args.payload)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
        if args.only in (None, "idle"):
            r = await bench_idle(os.path.join(root, "idle"), args.idle_groups, args.idle_seconds, True)
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
            if args.busy_seconds > 0:
                r = await bench_idle(os.path.join(root, "busy"), args.idle_groups, args.busy_seconds, False)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
        if args.only in (None, "election"):
            for groups in (1, 100):
                r = await bench_election(os.path.join(root, f"e{groups}"), args.elections, groups)
                rows.append(r)
                print(json.dumps(r), file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=["commits", "idle", "election"])
    ap.add_argument("--duration", type=float, default=5.0, help="seconds measured per commits run")
    ap.add_argument("--payload", type=int, default=64, help="bytes per proposal")
    ap.add_argument("--idle-groups", type=int, default=5000)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--busy-seconds", type=float, default=10.0, help="the same without quiescence (0: skip)")
    ap.add_argument("--elections", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where the data directories go (default: the temp dir)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines instead of a table")
    ns = ap.parse_args()
    try:
        import uvloop

        results = uvloop.run(main(ns))
        loop_name = "uvloop"
    except ImportError:
        results = asyncio.run(main(ns))
        loop_name = "asyncio"
    print(f"# {platform.python_implementation()} {platform.python_version()}, {loop_name}, "
          f"{os.cpu_count()} CPUs, data under {ns.dir or tempfile.gettempdir()}")
    if ns.json:
        for row in results:
            print(json.dumps(row))
    else:
        print(table(results))
