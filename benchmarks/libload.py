"""libload: issue 17's churn and idle-connection scenarios driven by a well-known client library (aio-pika).

The second, independent load generator for the two scenarios hutch-perf has no mode for. It shares no
client code with rawload.py (raw pre-encoded frames) or hutch-perf (hutch's codec): every connection,
channel, publish and confirm here is aio-pika's (on aiormq and pamqp), used the way an application uses
it — `aio_pika.connect`, `connection.channel(publisher_confirms=True)`, `default_exchange.publish` (which
waits for the broker's confirm), `connection.close`. It imports only rawload's /proc readers
(`proc_cpu`, `proc_rss_kib`), the idle mode's JSON summary (`idle_summary`), its process pool (`Workers`),
the broker options (`BrokerTarget`, `add_target_args`, `config_from`) and `raise_nofile`, so both
generators measure the broker the same way.

Workers are OS processes (multiprocessing 'spawn', uvloop when installed), `--processes` of them (default
2, as scenarios.py runs rawload), each with its share of the concurrency or connections. The parent
declares the churn queue, starts the workers, reads the broker's CPU (utime + stime) and RSS from /proc
at the edges of the measured window, and prints one JSON object with rawload's keys for the same modes.

Modes:
    churn  `--concurrency` loops at once, each: connect, open a channel with publisher confirms, publish
           one 16-byte message to a queue (x-max-length 1000) and wait for its confirm, close the
           connection; connections per second and broker CPU µs per connection (only loops that finish
           inside the window [start + warmup, + z) count)
    idle   `--connections` connections with one channel each, opened 100 at a time per process and held;
           broker RSS per connection (RSS after opening minus RSS before, over the connections opened),
           measured `--warmup` s after the last one opened; then the workers exit without closing
           them (the kernel closes the sockets); RLIMIT_NOFILE raised to the hard limit

    python benchmarks/libload.py --port 5672 --mode churn --concurrency 20 -z 8 --warmup 2 --pids 1234
    python benchmarks/libload.py --port 5672 --mode idle --connections 10000 -z 2 --pids 1234
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from typing import Any

import aio_pika
import aiormq
from rawload import (  # plumbing, options and /proc only, no client code
    BrokerTarget,
    Workers,
    add_target_args,
    config_from,
    idle_summary,
    proc_cpu,
    proc_rss_kib,
    raise_nofile,
)

CLOCK = time.CLOCK_MONOTONIC
FAILURES = (aiormq.exceptions.AMQPError, OSError, asyncio.TimeoutError, RuntimeError)
BODY = bytes(16)


@dataclass
class Config(BrokerTarget):
    mode: str = "churn"
    concurrency: int = 20
    connections: int = 1000
    processes: int = 2
    seconds: float = 8.0
    warmup: float = 2.0
    timeout: float = 30.0
    queue: str = ""

    def connect_kwargs(self) -> dict[str, Any]:
        return {"host": self.host, "port": self.port, "login": self.user, "password": self.password,
                "virtualhost": self.vhost, "timeout": self.timeout,
                "client_properties": {"connection_name": "libload"}}


def now_ns() -> int:
    return time.clock_gettime_ns(CLOCK)


# -- workers ---------------------------------------------------------------------------------------------

async def churn_one(cfg: Config) -> None:
    """One connection's life: open, channel with confirms, one confirmed publish, close."""
    connection = await aio_pika.connect(**cfg.connect_kwargs())
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.default_exchange.publish(aio_pika.Message(BODY), routing_key=cfg.queue, timeout=10)
    finally:
        await connection.close()


async def churn_worker(cfg: Config, loops: int, pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    pipe.send(("ready",))
    go_at, a, b = await loop.run_in_executor(None, pipe.recv)
    await asyncio.sleep(max(0.0, (go_at - now_ns()) / 1e9))
    done, failed = 0, 0
    errors: list[str] = []

    async def run_loop() -> None:
        nonlocal done, failed
        while now_ns() < b:
            try:
                await churn_one(cfg)
            except FAILURES as exc:
                failed += 1
                if len(errors) < 5:
                    errors.append(repr(exc))
                await asyncio.sleep(0.05)
                continue
            if a <= now_ns() < b:
                done += 1
    await asyncio.gather(*(run_loop() for _ in range(loops)))
    pipe.send(("result", {"connections": done, "failed": failed, "errors": errors}))


async def idle_worker(cfg: Config, count: int, pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(100)
    errors: list[str] = []

    async def open_one() -> aio_pika.abc.AbstractConnection | None:
        async with sem:
            try:
                connection = await aio_pika.connect(**cfg.connect_kwargs())
                await connection.channel(publisher_confirms=False)
                return connection
            except FAILURES as exc:
                if len(errors) < 5:
                    errors.append(repr(exc))
                return None
    t = time.monotonic()
    opened = [c for c in await asyncio.gather(*(open_one() for _ in range(count))) if c is not None]
    pipe.send(("ready", len(opened), time.monotonic() - t, errors))
    await loop.run_in_executor(None, pipe.recv)  # ("close",)
    pipe.send(("result", {"open": len(opened)}))
    pipe.close()
    # the process exits and the kernel closes its sockets (as rawload's idle mode closes them without a
    # connection.close): 5,000 aio-pika closes in turn would add some 20 s to every run, outside the window
    os._exit(0)


def worker_main(cfg: Config, count: int, pipe: Connection) -> None:
    raise_nofile()
    work = churn_worker if cfg.mode == "churn" else idle_worker
    run: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop
        run = uvloop.run
    try:
        run(work(cfg, count, pipe))
    except Exception as exc:  # reported to the parent, which fails the run
        pipe.send(("error", f"{cfg.mode} worker: {exc!r}"))


# -- the parent ------------------------------------------------------------------------------------------

def shares(total: int, parts: int) -> list[int]:
    """`total` split over at most `parts` workers as evenly as possible (no empty share)."""
    parts = max(1, min(total, parts))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def workers(cfg: Config, counts: list[int]) -> Workers:
    """One worker process per share of `counts` (rawload's process plumbing, this file's worker_main)."""
    w = Workers(join_s=30.0)
    try:
        for count in counts:
            w.add(worker_main, cfg, count)
    except BaseException:
        w.__exit__(None, None, None)
        raise
    return w


async def churn_queue(cfg: Config, create: bool) -> None:
    connection = await aio_pika.connect(**cfg.connect_kwargs())
    async with connection:
        channel = await connection.channel()
        if create:
            await channel.declare_queue(cfg.queue, arguments={"x-max-length": 1000})
        else:
            await channel.queue_delete(cfg.queue)


def run_churn(cfg: Config) -> dict[str, Any]:
    cfg.queue = f"libload-{os.getpid()}-churn"
    asyncio.run(churn_queue(cfg, True))
    try:
        with workers(cfg, shares(cfg.concurrency, cfg.processes)) as w:
            w.recv_all(120)
            go_at = now_ns() + 200_000_000
            a = go_at + int(cfg.warmup * 1e9)
            b = a + int(cfg.seconds * 1e9)
            w.send_all((go_at, a, b))
            time.sleep(max(0.0, (a - now_ns()) / 1e9))
            cpu0 = proc_cpu(cfg.pids)
            time.sleep(max(0.0, (b - now_ns()) / 1e9))
            cpu1 = proc_cpu(cfg.pids)
            results = [m[1] for m in w.recv_all(60 + cfg.timeout)]
    finally:
        asyncio.run(churn_queue(cfg, False))
    n = sum(r["connections"] for r in results)
    out: dict[str, Any] = {"connections": n, "connections_per_s": round(n / cfg.seconds, 1),
                           "failed": sum(r["failed"] for r in results),
                           "errors": [e for r in results for e in r["errors"]]}
    if cfg.pids:
        out.update(broker_cpu_s=round(cpu1 - cpu0, 3), broker_cpu_pct=round(100 * (cpu1 - cpu0) / cfg.seconds, 1),
                   broker_cpu_us_per_conn=round(1e6 * (cpu1 - cpu0) / n, 1) if n else None)
    return out


def run_idle(cfg: Config) -> dict[str, Any]:
    rss0 = proc_rss_kib(cfg.pids)
    with workers(cfg, shares(cfg.connections, cfg.processes)) as w:
        ready = w.recv_all(900)
        time.sleep(cfg.warmup)
        rss1 = proc_rss_kib(cfg.pids)
        cpu0 = proc_cpu(cfg.pids)
        time.sleep(cfg.seconds)
        cpu1 = proc_cpu(cfg.pids)
        w.send_all(("close",))
        w.recv_all(300)
    return idle_summary(ready, bool(cfg.pids), rss0, rss1, cpu1 - cpu0, cfg.seconds)


def parse(argv: list[str]) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_target_args(ap)
    a = ap.add_argument
    a("--mode", choices=("churn", "idle"), default="churn")
    a("--concurrency", type=int, default=20, help="churn: connections opened at the same time, in all")
    a("--connections", type=int, default=1000, help="idle: connections held, in all")
    a("--processes", type=int, default=2, help="worker processes (default 2)")
    a("-z", "--seconds", type=float, default=8.0, help="measured seconds (churn: after --warmup; idle: held)")
    a("--warmup", type=float, default=2.0, help="churn: seconds before the window; idle: settle before RSS")
    a("--timeout", type=float, default=30.0, help="seconds a connect may take")
    ns = ap.parse_args(argv)
    if ns.concurrency < 1 or ns.connections < 1 or ns.processes < 1:
        ap.error("--concurrency, --connections and --processes must be at least 1")
    return config_from(Config, ns)


def main(argv: list[str] | None = None) -> int:
    cfg = parse(sys.argv[1:] if argv is None else argv)
    raise_nofile()
    t0 = time.time()
    result = run_churn(cfg) if cfg.mode == "churn" else run_idle(cfg)
    conf = {k: v for k, v in asdict(cfg).items() if k != "password"}
    conf["client"] = f"aio-pika {aio_pika.__version__}"
    print(json.dumps({"tool": "libload", "config": conf, "started": round(t0, 1), **result}), flush=True)
    return 1 if result.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
