"""rawload: a second, independent AMQP 0-9-1 load generator (issue 17), not hutch-perf's code path.

It shares no code with hutch (neither `hutch.perf` nor `hutch.amqp`): every frame it sends is encoded
here with `struct`, once, before the run (a publish is `prefix + 8-byte timestamp + suffix`, a batch is
that repeated, one `write`), and every frame it reads is walked in place with `struct.unpack_from`.
Producers and consumers run in separate OS processes (multiprocessing 'spawn', uvloop when installed),
so a consumer's parsing never delays a publish. The parent process only declares the topology, starts
the workers, reads the broker's CPU and RSS from /proc at the edges of the measured window, and prints
one JSON object.

Modes:
    flow   (default) producers -> queues (or a fanout exchange) -> consumers; received msg/s, latency
           p50/p95/p99 (send timestamp in the body, CLOCK_MONOTONIC), broker CPU µs per delivered message
    churn  connections opened and closed in a loop: open, channel, confirm.select, one publish, wait
           for its ack, connection.close; connections per second and broker CPU µs per connection
    idle   N connections with one channel each, held open; broker RSS per connection (RLIMIT_NOFILE is
           raised to the hard limit in every process)

    python benchmarks/rawload.py --port 5672 -x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 -z 10 --pids 1234
    python benchmarks/rawload.py --port 5672 -x 1 -y 3 --fanout 3 -s 16 -c 1000 -q 1000 -A 100 -z 10
    python benchmarks/rawload.py --port 5672 -x 1000 -y 1000 --queues 1000 -r 10000 -c 100 -q 100 -A 10
    python benchmarks/rawload.py --port 5672 --mode churn --concurrency 20 -z 10
    python benchmarks/rawload.py --port 5672 --mode idle --connections 10000 --pids 1234
    python benchmarks/rawload.py --port 5671 --cacert ca.pem -x 1 -y 1 -s 16 -z 10   # over TLS

Counting: only what happens inside the window [start + warmup, start + warmup + z) is counted (a read
is in the window if the clock at the read is); rates are counts / z. `-r` is the TOTAL publish rate,
split evenly over the producers. Producer p publishes round-robin to the queues q with q % x == p (or
to queue p % Q when there are more producers than queues); consumer j consumes the queues q with
q % y == j (or queue j % Q). With `--fanout N`, producers publish to a fanout exchange bound to N queues.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import resource
import ssl
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

# -- the wire: every frame rawload needs, encoded with struct ---------------------------------------------

FRAME_END = b"\xce"
HDR = struct.Struct(">BHI")  # frame type, channel, payload size
CM = struct.Struct(">I")  # class id << 16 | method id
U64 = struct.Struct(">Q")
CLOCK = time.CLOCK_MONOTONIC
TICK = os.sysconf("SC_CLK_TCK")


def cm(class_id: int, method_id: int) -> int:
    return class_id << 16 | method_id


START, START_OK, TUNE, TUNE_OK, OPEN, OPEN_OK = cm(10, 10), cm(10, 11), cm(10, 30), cm(10, 31), cm(10, 40), \
    cm(10, 41)
CLOSE, CLOSE_OK, CH_OPEN, CH_OPEN_OK, CH_CLOSE = cm(10, 50), cm(10, 51), cm(20, 10), cm(20, 11), cm(20, 40)
EX_DECLARE, EX_DECLARE_OK, EX_DELETE, EX_DELETE_OK = cm(40, 10), cm(40, 11), cm(40, 20), cm(40, 21)
Q_DECLARE, Q_DECLARE_OK, Q_BIND, Q_BIND_OK, Q_DELETE, Q_DELETE_OK = cm(50, 10), cm(50, 11), cm(50, 20), \
    cm(50, 21), cm(50, 40), cm(50, 41)
QOS, QOS_OK, CONSUME, CONSUME_OK, PUBLISH, DELIVER = cm(60, 10), cm(60, 11), cm(60, 20), cm(60, 21), \
    cm(60, 40), cm(60, 60)
ACK, NACK, SELECT, SELECT_OK = cm(60, 80), cm(60, 120), cm(85, 10), cm(85, 11)


def shortstr(s: str) -> bytes:
    b = s.encode()
    return bytes([len(b)]) + b


def longstr(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def table(d: dict[str, Any]) -> bytes:
    out = b""
    for k, v in d.items():
        if isinstance(v, bool):
            out += shortstr(k) + b"t" + bytes([v])
        elif isinstance(v, int):
            out += shortstr(k) + b"l" + struct.pack(">q", v)
        else:
            out += shortstr(k) + b"S" + longstr(str(v).encode())
    return longstr(out)


def frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return HDR.pack(ftype, channel, len(payload)) + payload + FRAME_END


def method(channel: int, code: int, args: bytes = b"") -> bytes:
    return frame(1, channel, CM.pack(code) + args)


def publish_parts(exchange: str, routing_key: str, size: int, persistent: bool, frame_max: int) -> tuple[bytes, bytes]:
    """A publish (method + header + body frames) split around the body's first 8 bytes (the timestamp)."""
    pub = method(1, PUBLISH, b"\0\0" + shortstr(exchange) + shortstr(routing_key) + b"\0")
    header = frame(2, 1, struct.pack(">HHQH", 60, 0, size, 0x1000) + bytes([2 if persistent else 1]))
    chunk = frame_max - 8
    body = bytes(size)
    frames = [frame(3, 1, body[i:i + chunk]) for i in range(0, size, chunk)]
    whole = pub + header + b"".join(frames)
    ts_at = len(pub) + len(header) + 7
    return whole[:ts_at], whole[ts_at + 8:]


# -- a client connection ---------------------------------------------------------------------------------

class Closed(Exception):
    """The broker closed the connection or a channel (reply code and text), or the socket went away."""


class Client(asyncio.Protocol):
    """One AMQP connection. Synchronous methods go through `rpc` (one at a time); the hot methods (deliver,
    ack, nack) and content frames go to `on_deliver` / `on_ack` / `on_body`, read in place."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: Any = None
        self.buf = b""
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.pending: list[tuple[int, bytes]] = []
        self.error: Exception | None = None
        self.frame_max = 131072
        self.paused = False
        self.lost = self.loop.create_future()
        self.first_body = False
        self.running = False
        self.hot = False  # set once a producer's or consumer's plan is in place

    # the transport
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(Closed(f"connection lost: {exc}"))
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.on_resume()

    def fail(self, exc: Exception) -> None:
        if self.error is None:
            self.error = exc
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos, n = 0, len(buf)
        now = time.clock_gettime_ns(CLOCK)
        while n - pos >= 7:
            ftype, _ch, size = HDR.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if ftype == 3:
                self.on_body(buf, pos + 7, size, now)
            elif ftype == 1:
                code = CM.unpack_from(buf, pos + 7)[0]
                if code == DELIVER:
                    self.on_deliver(U64.unpack_from(buf, pos + 12 + buf[pos + 11])[0])
                elif code in (ACK, NACK):
                    self.on_ack(U64.unpack_from(buf, pos + 11)[0], buf[pos + 19] & 1, code == ACK)
                else:
                    self.on_method(code, buf[pos + 11:end])
            elif ftype == 2:
                self.first_body = True  # the timestamp is in the first body frame of a message
            pos = end + 1
        self.buf = buf[pos:] if pos < n else b""
        if self.hot:
            self.after_read(now)

    def on_method(self, code: int, args: bytes) -> None:
        if code in (CLOSE, CH_CLOSE):
            reply, = struct.unpack_from(">H", args)
            text = args[3:3 + args[2]].decode(errors="replace")
            if code == CLOSE:
                self.transport.write(method(0, CLOSE_OK))
            self.fail(Closed(f"{reply} {text}"))
            return
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((code, args))
        else:
            self.pending.append((code, args))

    # hooks of the hot path (overridden by producers and consumers)
    def on_body(self, buf: bytes, at: int, size: int, now: int) -> None:
        pass

    def on_deliver(self, tag: int) -> None:
        pass

    def on_ack(self, tag: int, multiple: int, ok: bool) -> None:
        pass

    def after_read(self, now: int) -> None:
        pass

    def on_resume(self) -> None:
        pass

    # synchronous methods
    async def expect(self, want: int) -> bytes:
        while True:
            if self.error is not None:
                raise self.error
            if self.pending:
                code, args = self.pending.pop(0)
            else:
                self.waiter = self.loop.create_future()
                code, args = await self.waiter
                self.waiter = None
            if code == want:
                return args

    async def rpc(self, channel: int, code: int, args: bytes, reply: int) -> bytes:
        self.transport.write(method(channel, code, args))
        return await self.expect(reply)

    async def handshake(self, user: str, password: str, vhost: str) -> None:
        self.transport.write(b"AMQP\x00\x00\x09\x01")
        await self.expect(START)
        props = table({"product": "rawload"})
        self.transport.write(method(0, START_OK, props + shortstr("PLAIN")
                                    + longstr(f"\0{user}\0{password}".encode()) + shortstr("en_US")))
        tune = await self.expect(TUNE)
        channel_max, frame_max, _hb = struct.unpack(">HIH", tune[:8])
        self.frame_max = min(frame_max or 131072, 131072)
        self.transport.write(method(0, TUNE_OK, struct.pack(">HIH", channel_max, self.frame_max, 0)))
        await self.rpc(0, OPEN, shortstr(vhost) + b"\0\0", OPEN_OK)
        await self.rpc(1, CH_OPEN, b"\0", CH_OPEN_OK)

    async def close(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        with contextlib.suppress(Closed, asyncio.TimeoutError, OSError):
            self.transport.write(method(0, CLOSE, struct.pack(">H", 200) + shortstr("bye") + b"\0\0\0\0"))
            await asyncio.wait_for(self.expect(CLOSE_OK), 5)
        self.transport.close()


CONNECT_TIMEOUT_S = 30.0


async def connect(cfg: Config, factory: type[Client] = Client, *a: Any) -> Any:
    """A connection with channel 1 open; Closed after CONNECT_TIMEOUT_S (a broker out of descriptors
    stops accepting without refusing)."""
    loop = asyncio.get_running_loop()

    async def attempt() -> Any:
        ctx = ssl.create_default_context(cafile=cfg.cacert) if getattr(cfg, "cacert", "") else None
        _, client = await loop.create_connection(lambda: factory(*a), cfg.host, cfg.port, ssl=ctx)
        try:
            await client.handshake(cfg.user, cfg.password, cfg.vhost)
        except BaseException:
            client.transport.close()
            raise
        return client
    try:
        return await asyncio.wait_for(attempt(), CONNECT_TIMEOUT_S)
    except TimeoutError:
        raise Closed(f"no connection within {CONNECT_TIMEOUT_S:.0f} s") from None


# -- configuration ---------------------------------------------------------------------------------------

@dataclass
class BrokerTarget:
    """The broker a load generator drives, and its process ids (CPU and RSS from /proc); libload.py's
    configuration starts from it too."""

    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    pids: list[int] = field(default_factory=list)


def add_target_args(ap: argparse.ArgumentParser) -> None:
    """The options of `BrokerTarget` (`--pids` comma-separated)."""
    a = ap.add_argument
    a("--host", default="127.0.0.1")
    a("--port", type=int, default=5672)
    a("--user", default="guest")
    a("--password", default="guest")
    a("--vhost", default="/")
    a("--pids", default="", help="broker process ids (comma-separated): CPU and RSS from /proc")


TargetT = TypeVar("TargetT", bound=BrokerTarget)


def config_from(cls: type[TargetT], ns: argparse.Namespace) -> TargetT:
    """A tool's configuration from its parsed options (`--pids` made a list of ints)."""
    return cls(**{k: v for k, v in vars(ns).items() if k != "pids"}, pids=[int(p) for p in ns.pids.split(",") if p])


@dataclass
class Config(BrokerTarget):
    mode: str = "flow"
    producers: int = 1
    consumers: int = 1
    queues: int = 1
    fanout: int = 0
    size: int = 16
    confirm: int = 1000
    prefetch: int = 1000
    multi_ack: int = 100
    rate: float = 0.0
    seconds: float = 10.0
    warmup: float = 2.0
    persistent: bool = False
    quorum: bool = False
    stream: str = ""  # x-stream-offset of the consumers ("next", "first", ...): the queues are streams
    cacert: str = ""  # AMQP over TLS, verifying the broker with this CA file (the port is the TLS one)
    processes: int = 1
    concurrency: int = 20
    connections: int = 1000
    queue_names: list[str] = field(default_factory=list)
    exchange: str = ""


def assigned(index: int, clients: int, queues: int) -> list[int]:
    """The queues client `index` of `clients` serves (see the module docstring)."""
    if clients >= queues:
        return [index % queues]
    return [q for q in range(queues) if q % clients == index]


# -- histogram (log-linear, 64 sub-buckets per power of two: within 1.6 %) -------------------------------

def bucket(v: int) -> int:
    b = v.bit_length()
    return v if b <= 7 else (b << 6) | ((v >> (b - 7)) & 63)


def bucket_top(i: int) -> int:
    if i < 128:
        return i
    b, sub = i >> 6, i & 63
    return ((64 | sub) + 1) << (b - 7)


def percentiles(hist: dict[int, int], ps: tuple[float, ...] = (0.5, 0.95, 0.99)) -> dict[str, float]:
    total = sum(hist.values())
    out: dict[str, float] = {}
    if not total:
        return {f"p{int(p * 100)}": 0.0 for p in ps}
    keys = sorted(hist)
    for p in ps:
        rank, seen = p * total, 0
        for k in keys:
            seen += hist[k]
            if seen >= rank:
                out[f"p{int(p * 100)}"] = round(bucket_top(k) / 1000, 1)  # µs
                break
    out["max"] = round(bucket_top(keys[-1]) / 1000, 1)
    return out


# -- workers ---------------------------------------------------------------------------------------------

class Producer(Client):
    def setup_plan(self, cfg: Config, targets: list[tuple[str, str]], rate: float) -> None:
        parts = [publish_parts(ex, rk, cfg.size, cfg.persistent, self.frame_max) for ex, rk in targets]
        one = len(parts[0][0]) + 8 + len(parts[0][1])
        self.batch_max = max(1, min(1024, 65536 // one))
        self.parts = parts
        self.next_target = 0
        self.window = cfg.confirm
        self.rate = rate
        self.tokens = 0.0
        self.published = self.confirmed = self.nacked = 0
        self.acked_low = 0  # every tag <= acked_low is settled
        self.singles: set[int] = set()
        self.counting = (0, 0)
        self.counted_pub = self.counted_conf = 0
        self.running = False
        self.scheduled = False
        self.hot = True

    def start(self) -> None:
        self.running = True
        self.pump()

    def pump(self) -> None:
        self.scheduled = False
        if not self.running or self.paused:
            return
        room = self.batch_max
        if self.window:
            room = min(room, self.window - (self.published - self.confirmed - self.nacked))
        if self.rate:
            room = min(room, int(self.tokens))
        if room <= 0:
            return
        ts = time.clock_gettime_ns(CLOCK).to_bytes(8, "big")
        if len(self.parts) == 1:
            pre, suf = self.parts[0]
            data = (pre + ts + suf) * room
        else:
            k, m = self.next_target, len(self.parts)
            data = b"".join(b"".join((self.parts[(k + i) % m][0], ts, self.parts[(k + i) % m][1]))
                            for i in range(room))
            self.next_target = (k + room) % m
        self.transport.write(data)
        self.published += room
        if self.rate:
            self.tokens -= room
        a, b = self.counting
        if a <= int.from_bytes(ts, "big") < b:
            self.counted_pub += room
        if room == self.batch_max and not self.scheduled:  # capped by the batch size: more may be due
            self.scheduled = True
            self.loop.call_soon(self.pump)

    def on_ack(self, tag: int, multiple: int, ok: bool) -> None:
        if multiple:
            if tag <= self.acked_low:
                return
            below = {t for t in self.singles if t <= tag}
            settled = tag - self.acked_low - len(below)
            self.singles -= below
            self.acked_low = tag
        elif tag <= self.acked_low or tag in self.singles:
            return
        else:
            settled = 1
            self.singles.add(tag)
            while self.acked_low + 1 in self.singles:
                self.acked_low += 1
                self.singles.discard(self.acked_low)
        if ok:
            self.confirmed += settled
        else:
            self.nacked += settled
        a, b = self.counting
        if ok and a <= time.clock_gettime_ns(CLOCK) < b:
            self.counted_conf += settled

    def after_read(self, now: int) -> None:
        if not self.scheduled and self.running:
            self.scheduled = True
            self.loop.call_soon(self.pump)

    def on_resume(self) -> None:
        if self.hot:
            self.after_read(0)


class Consumer(Client):
    def setup_plan(self, cfg: Config) -> None:
        self.multi = cfg.multi_ack
        self.unacked = 0
        self.last_tag = 0
        self.ts_counts: Counter[int] = Counter()
        self.hist: Counter[int] = Counter()
        self.counting = (0, 0)
        self.received = 0
        self.hot = True

    def on_deliver(self, tag: int) -> None:
        self.last_tag = tag
        self.unacked += 1

    def on_body(self, buf: bytes, at: int, size: int, now: int) -> None:
        if self.first_body and size >= 8:
            self.first_body = False
            self.ts_counts[U64.unpack_from(buf, at)[0]] += 1

    def after_read(self, now: int) -> None:
        if self.unacked >= self.multi > 0:
            self.transport.write(method(1, ACK, U64.pack(self.last_tag) + b"\x01"))
            self.unacked = 0
        if self.ts_counts:
            a, b = self.counting
            if a <= now < b:
                for ts, k in self.ts_counts.items():
                    self.hist[bucket(now - ts)] += k
                    self.received += k
            self.ts_counts.clear()


async def setup_client(role: str, cfg: Config, i: int) -> Client:
    """Producer or consumer number i, connected and set up (confirm.select; qos and consume)."""
    if role == "producer":
        p: Producer = await connect(cfg, Producer)
        if cfg.fanout:
            targets = [(cfg.exchange, "")]
        else:
            targets = [("", cfg.queue_names[q]) for q in assigned(i, cfg.producers, len(cfg.queue_names))]
        p.setup_plan(cfg, targets, cfg.rate / cfg.producers if cfg.rate else 0.0)
        if cfg.confirm:
            await p.rpc(1, SELECT, b"\0", SELECT_OK)
        return p
    c: Consumer = await connect(cfg, Consumer)
    c.setup_plan(cfg)
    await c.rpc(1, QOS, struct.pack(">IHB", 0, cfg.prefetch, 0), QOS_OK)
    for q in assigned(i, cfg.consumers, len(cfg.queue_names)):
        await c.rpc(1, CONSUME, b"\0\0" + shortstr(cfg.queue_names[q]) + shortstr("")
                    + bytes([0 if cfg.multi_ack else 2])
                    + table({"x-stream-offset": cfg.stream} if cfg.stream else {}), CONSUME_OK)
    return c


async def flow_worker(role: str, cfg: Config, indexes: list[int], pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(50)

    async def one(i: int) -> Client:
        async with sem:
            return await setup_client(role, cfg, i)
    clients: list[Any] = await asyncio.gather(*(one(i) for i in indexes))
    pipe.send(("ready",))
    go_at, a, b = await loop.run_in_executor(None, pipe.recv)
    for cl in clients:
        cl.counting = (a, b)
    await asyncio.sleep(max(0.0, (go_at - time.clock_gettime_ns(CLOCK)) / 1e9))
    ticker = None
    if role == "producer":
        for p in clients:
            p.start()
        if cfg.rate:
            ticker = asyncio.ensure_future(rate_ticker(clients))
    await asyncio.sleep(max(0.0, (b - time.clock_gettime_ns(CLOCK)) / 1e9))
    for cl in clients:
        cl.running = False
    if ticker is not None:
        ticker.cancel()
    errors = [str(cl.error) for cl in clients if cl.error is not None]
    if role == "producer":
        res = {"published": sum(p.counted_pub for p in clients), "confirmed": sum(p.counted_conf for p in clients),
               "nacked": sum(p.nacked for p in clients), "errors": errors}
    else:
        await asyncio.sleep(0.3)  # the deliveries already in flight, for the acks below
        hist: Counter[int] = Counter()
        for c in clients:
            hist.update(c.hist)
            if c.last_tag and cfg.multi_ack:
                c.transport.write(method(1, ACK, U64.pack(c.last_tag) + b"\x01"))
        res = {"received": sum(c.received for c in clients), "hist": dict(hist), "errors": errors}
    await asyncio.gather(*(cl.close() for cl in clients))
    pipe.send(("result", res))


async def rate_ticker(producers: list[Producer]) -> None:
    """Refill every producer's token bucket: every 10 ms, or every 1/rate s (at most 100 ms) for producers
    slower than 100 msg/s, so 1,000 producers at 10 msg/s cost 10 wake-ups a second, not 100."""
    rate = min(p.rate for p in producers)
    interval = min(0.1, max(0.01, 1.0 / rate))
    last = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        now = time.monotonic()
        dt, last = now - last, now
        for p in producers:
            p.tokens = min(p.tokens + p.rate * dt, max(1.0, p.rate * max(0.05, 2 * interval)))
            if p.tokens >= 1:
                p.pump()


async def churn_worker(cfg: Config, indexes: list[int], pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    pipe.send(("ready",))
    go_at, a, b = await loop.run_in_executor(None, pipe.recv)
    await asyncio.sleep(max(0.0, (go_at - time.clock_gettime_ns(CLOCK)) / 1e9))
    done = [0, 0]
    errors: list[str] = []
    pre, suf = publish_parts("", cfg.queue_names[0], cfg.size, False, 4096)

    async def loop_one() -> None:
        while time.clock_gettime_ns(CLOCK) < b:
            try:
                cl: Client = await connect(cfg, Client)
                await cl.rpc(1, SELECT, b"\0", SELECT_OK)
                acked = loop.create_future()
                cl.on_ack = lambda tag, m, ok, f=acked: f.done() or f.set_result(ok)  # type: ignore[method-assign]
                cl.transport.write(pre + time.clock_gettime_ns(CLOCK).to_bytes(8, "big") + suf)
                await asyncio.wait_for(acked, 10)
                await cl.close()
            except (TimeoutError, Closed, OSError) as exc:
                errors.append(repr(exc))
                done[1] += 1
                await asyncio.sleep(0.05)
                continue
            if a <= time.clock_gettime_ns(CLOCK) < b:
                done[0] += 1
    await asyncio.gather(*(loop_one() for _ in indexes))
    pipe.send(("result", {"connections": done[0], "failed": done[1], "errors": errors[:5]}))


async def idle_worker(cfg: Config, indexes: list[int], pipe: Connection) -> None:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(100)
    errors: list[str] = []

    async def one() -> Client | None:
        async with sem:
            try:
                return await connect(cfg, Client)
            except (Closed, OSError) as exc:
                errors.append(repr(exc))
                return None
    t = time.monotonic()
    clients = [c for c in await asyncio.gather(*(one() for _ in indexes)) if c is not None]
    pipe.send(("ready", len(clients), time.monotonic() - t, errors[:5]))
    await loop.run_in_executor(None, pipe.recv)  # ("close",)
    for c in clients:
        c.transport.close()
    pipe.send(("result", {"open": len(clients)}))


def worker_main(kind: str, role: str, cfg: Config, indexes: list[int], pipe: Connection) -> None:
    raise_nofile()
    try:
        import uvloop
        run = uvloop.run
    except ImportError:
        run = asyncio.run
    try:
        if kind == "flow":
            run(flow_worker(role, cfg, indexes, pipe))
        elif kind == "churn":
            run(churn_worker(cfg, indexes, pipe))
        else:
            run(idle_worker(cfg, indexes, pipe))
    except Exception as exc:  # reported to the parent, which fails the run
        pipe.send(("error", f"{role}: {exc!r}"))


# -- the parent ------------------------------------------------------------------------------------------

def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def proc_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(f[11]) + int(f[12])) / TICK
    return total


def proc_rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


async def topology(cfg: Config, create: bool) -> None:
    c: Client = await connect(cfg, Client)
    try:
        args: dict[str, Any] = {"x-queue-type": "quorum"} if cfg.quorum else {}
        if cfg.stream:
            args = {"x-queue-type": "stream"}
        if cfg.mode == "churn":
            args["x-max-length"] = 1000
        durable = cfg.persistent or cfg.quorum or bool(cfg.stream)
        if cfg.exchange and create:
            await c.rpc(1, EX_DECLARE, b"\0\0" + shortstr(cfg.exchange) + shortstr("fanout") + b"\0" + table({}),
                        EX_DECLARE_OK)
        for q in cfg.queue_names:
            if create:
                await c.rpc(1, Q_DECLARE, b"\0\0" + shortstr(q) + bytes([2 if durable else 0]) + table(args),
                            Q_DECLARE_OK)
                if cfg.exchange:
                    await c.rpc(1, Q_BIND, b"\0\0" + shortstr(q) + shortstr(cfg.exchange) + shortstr("") + b"\0"
                                + table({}), Q_BIND_OK)
            else:
                await c.rpc(1, Q_DELETE, b"\0\0" + shortstr(q) + b"\0", Q_DELETE_OK)
        if cfg.exchange and not create:
            await c.rpc(1, EX_DELETE, b"\0\0" + shortstr(cfg.exchange) + b"\0", EX_DELETE_OK)
    finally:
        await c.close()


def spread(n: int, groups: int) -> list[list[int]]:
    groups = max(1, min(n, groups))
    return [list(range(g, n, groups)) for g in range(groups)]


class Workers:
    """Worker processes with their pipes; every one is joined (or killed) on exit. Also libload.py's (the
    process plumbing only: its workers run its own client code)."""

    def __init__(self, join_s: float = 10.0) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []
        self.pipes: list[Connection] = []
        self.join_s = join_s

    def add(self, target: Callable[..., None], *args: Any) -> None:
        """Start `target(*args, pipe)` in a new process."""
        parent, child = self.ctx.Pipe()
        p = self.ctx.Process(target=target, args=(*args, child), daemon=True)
        p.start()
        child.close()
        self.procs.append(p)
        self.pipes.append(parent)

    def recv_all(self, timeout: float) -> list[tuple[Any, ...]]:
        """One message from every worker, all within `timeout` s; a worker's ("error", text) raises."""
        out = []
        deadline = time.monotonic() + timeout
        for pipe in self.pipes:
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise RuntimeError("a worker did not answer in time")
            msg = pipe.recv()
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            out.append(msg)
        return out

    def send_all(self, msg: tuple[Any, ...]) -> None:
        for pipe in self.pipes:
            pipe.send(msg)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: Any) -> None:
        for p in self.procs:
            p.join(timeout=self.join_s)
            if p.is_alive():
                p.kill()
                p.join()


def run_flow(cfg: Config) -> dict[str, Any]:
    with Workers() as w:
        for indexes in spread(cfg.producers, cfg.processes):
            w.add(worker_main, "flow", "producer", cfg, indexes)
        for indexes in spread(cfg.consumers, cfg.processes):
            w.add(worker_main, "flow", "consumer", cfg, indexes)
        w.recv_all(120)
        now = time.clock_gettime_ns(CLOCK)
        go_at = now + 200_000_000
        a = go_at + int(cfg.warmup * 1e9)
        b = a + int(cfg.seconds * 1e9)
        w.send_all((go_at, a, b))
        clients = [p.pid for p in w.procs]
        time.sleep(max(0.0, (a - time.clock_gettime_ns(CLOCK)) / 1e9))
        cpu0, rss0, own0 = proc_cpu(cfg.pids), proc_rss_kib(cfg.pids), proc_cpu(clients)
        time.sleep(max(0.0, (b - time.clock_gettime_ns(CLOCK)) / 1e9))
        cpu1, rss1, own1 = proc_cpu(cfg.pids), proc_rss_kib(cfg.pids), proc_cpu(clients)
        results = [m[1] for m in w.recv_all(60 + cfg.seconds)]
    hist: Counter[int] = Counter()
    for r in results:
        hist.update({int(k): v for k, v in r.get("hist", {}).items()})
    received = sum(r.get("received", 0) for r in results)
    published = sum(r.get("published", 0) for r in results)
    confirmed = sum(r.get("confirmed", 0) for r in results)
    out = {"published": published, "confirmed": confirmed, "received": received,
           "nacked": sum(r.get("nacked", 0) for r in results),
           "publish_rate": round(published / cfg.seconds), "confirm_rate": round(confirmed / cfg.seconds),
           "receive_rate": round(received / cfg.seconds), "latency_us": percentiles(hist),
           "errors": [e for r in results for e in r.get("errors", [])],
           "client_cpu_pct": round(100 * (own1 - own0) / cfg.seconds, 1),
           "client_cpu_us_per_msg": round(1e6 * (own1 - own0) / received, 2) if received else None}
    if cfg.pids:
        out.update(broker_cpu_s=round(cpu1 - cpu0, 3), broker_cpu_pct=round(100 * (cpu1 - cpu0) / cfg.seconds, 1),
                   broker_cpu_us_per_msg=round(1e6 * (cpu1 - cpu0) / received, 2) if received else None,
                   broker_rss_mib=[round(rss0 / 1024, 1), round(rss1 / 1024, 1)])
    return out


def run_churn(cfg: Config) -> dict[str, Any]:
    with Workers() as w:
        for indexes in spread(cfg.concurrency, cfg.processes):
            w.add(worker_main, "churn", "churn", cfg, indexes)
        w.recv_all(60)
        go_at = time.clock_gettime_ns(CLOCK) + 200_000_000
        a = go_at + int(cfg.warmup * 1e9)
        b = a + int(cfg.seconds * 1e9)
        w.send_all((go_at, a, b))
        time.sleep(max(0.0, (a - time.clock_gettime_ns(CLOCK)) / 1e9))
        cpu0 = proc_cpu(cfg.pids)
        time.sleep(max(0.0, (b - time.clock_gettime_ns(CLOCK)) / 1e9))
        cpu1 = proc_cpu(cfg.pids)
        results = [m[1] for m in w.recv_all(60)]
    n = sum(r["connections"] for r in results)
    out = {"connections": n, "connections_per_s": round(n / cfg.seconds, 1),
           "failed": sum(r["failed"] for r in results), "errors": [e for r in results for e in r["errors"]]}
    if cfg.pids:
        out.update(broker_cpu_s=round(cpu1 - cpu0, 3), broker_cpu_pct=round(100 * (cpu1 - cpu0) / cfg.seconds, 1),
                   broker_cpu_us_per_conn=round(1e6 * (cpu1 - cpu0) / n, 1) if n else None)
    return out


def run_idle(cfg: Config) -> dict[str, Any]:
    raise_nofile()
    rss0 = proc_rss_kib(cfg.pids)
    with Workers() as w:
        for indexes in spread(cfg.connections, cfg.processes):
            w.add(worker_main, "idle", "idle", cfg, indexes)
        ready = w.recv_all(600)
        time.sleep(cfg.warmup)
        rss1 = proc_rss_kib(cfg.pids)
        cpu0 = proc_cpu(cfg.pids)
        time.sleep(cfg.seconds)
        cpu1 = proc_cpu(cfg.pids)
        w.send_all(("close",))
        w.recv_all(120)
    return idle_summary(ready, bool(cfg.pids), rss0, rss1, cpu1 - cpu0, cfg.seconds)


def idle_summary(ready: list[Any], measured: bool, rss0: float, rss1: float, cpu_s: float,
                 seconds: float) -> dict[str, Any]:
    """The idle mode's JSON (also libload.py's): `ready` holds each worker's (tag, connections opened,
    seconds to open them, errors); RSS in KiB before and after opening, broker CPU seconds while idle."""
    n = sum(m[1] for m in ready)
    out: dict[str, Any] = {"connections": n, "open_s": round(max(m[2] for m in ready), 2),
                           "errors": [e for m in ready for e in m[3]]}
    if measured:
        out.update(broker_rss_mib=[round(rss0 / 1024, 1), round(rss1 / 1024, 1)],
                   kib_per_connection=round((rss1 - rss0) / n, 1) if n else None,
                   idle_broker_cpu_pct=round(100 * cpu_s / seconds, 2))
    return out


def parse(argv: list[str]) -> Config:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_target_args(ap)
    a = ap.add_argument
    a("--mode", choices=("flow", "churn", "idle"), default="flow")
    a("-x", "--producers", type=int, default=1)
    a("-y", "--consumers", type=int, default=1)
    a("--queues", type=int, default=1, help="queues the producers publish to round-robin (default 1)")
    a("--fanout", type=int, default=0, help="publish to a fanout exchange bound to N queues")
    a("-s", "--size", type=int, default=16, help="body bytes (>= 8: the send timestamp)")
    a("-c", "--confirm", type=int, default=1000, help="confirm window per producer (0: no confirms)")
    a("-q", "--prefetch", type=int, default=1000)
    a("-A", "--multi-ack", type=int, default=100, help="ack multiple every N deliveries (0: no-ack)")
    a("-r", "--rate", type=float, default=0.0, help="TOTAL publish rate, msg/s (0: unlimited)")
    a("-z", "--seconds", type=float, default=10.0, help="measured seconds (after --warmup)")
    a("--warmup", type=float, default=2.0)
    a("--persistent", action="store_true", help="delivery mode 2 to durable queues")
    a("--quorum", action="store_true", help="quorum queues")
    a("--stream", default="", metavar="OFFSET",
      help="stream queues, consumed from this x-stream-offset (next, first, ...; consumers need -A > 0)")
    a("--processes", type=int, default=1, help="OS processes per role (default 1)")
    a("--cacert", default="", metavar="FILE", help="AMQP over TLS (--port is the TLS port), this CA verifying the broker")
    a("--concurrency", type=int, default=20, help="churn: connections opened at the same time")
    a("--connections", type=int, default=1000, help="idle: connections held")
    ns = ap.parse_args(argv)
    if ns.size < 8:
        ap.error("--size must be at least 8")
    if ns.multi_ack and ns.prefetch and ns.multi_ack > ns.prefetch:
        ap.error("--multi-ack may not exceed --prefetch (the consumer would stall)")
    cfg = config_from(Config, ns)
    tag = f"rawload-{os.getpid()}"
    if cfg.mode == "idle":
        return cfg
    if cfg.mode == "churn":
        cfg.queue_names = [f"{tag}-churn"]
    elif cfg.fanout:
        cfg.exchange = f"{tag}-fanout"
        cfg.queue_names = [f"{tag}-{i}" for i in range(cfg.fanout)]
    else:
        cfg.queue_names = [f"{tag}-{i}" for i in range(cfg.queues)]
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse(sys.argv[1:] if argv is None else argv)
    raise_nofile()
    t0 = time.time()
    run_async = asyncio.run
    if cfg.mode != "idle":
        run_async(topology(cfg, True))
    try:
        result = {"flow": run_flow, "churn": run_churn, "idle": run_idle}[cfg.mode](cfg)
    finally:
        if cfg.mode != "idle":
            run_async(topology(cfg, False))
    conf = {k: v for k, v in asdict(cfg).items() if k not in ("password", "queue_names")}
    print(json.dumps({"tool": "rawload", "config": conf, "started": round(t0, 1), **result}), flush=True)
    return 1 if result.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
