"""Helpers of the Spark suite: unique names, publishing and inspecting queues with pika, waiting, and
`Proxy`, a TCP relay between Spark and hutch that the tests cut to make "the broker" go away (or go
silent) while the real broker stays up and requeues what the lost connections held.

Rules: every wait has a deadline; nothing here talks to ports 5672/15672.
"""

from __future__ import annotations

import itertools
import os
import re
import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pika
import pytest

from conftest import start_server  # tests/conftest.py (tests/ is on sys.path)

_counter = itertools.count(1)

# the costly stream tests read with the JVM reader (what `format("hutch")` is) in `make test`, and with the
# Python source too in `make test-slow` (the cheap ones run both ways in `make test`; conftest's `stream_format`)
JVM_NOW_PYTHON_SLOW = pytest.mark.parametrize(
    "stream_format", ["hutch", pytest.param("hutch-python", marks=pytest.mark.slow)], indirect=True)


def unique(prefix: str = "sq") -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{time.monotonic_ns() % 1_000_000}"


def amqp_uri(port: int, **query: Any) -> str:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    return f"amqp://guest:guest@127.0.0.1:{port}/%2F" + (f"?{qs}" if qs else "")


class Broker:
    """A pika connection to the test broker, for setting up and inspecting queues. No heartbeats: a
    BlockingConnection answers them only inside its calls, and a long Spark test leaves it idle for
    minutes (the broker then dropped it for missed heartbeats, failing the fixture's teardown)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", port, "/", pika.PlainCredentials("guest", "guest"), connection_attempts=3,
            socket_timeout=10, blocked_connection_timeout=60, heartbeat=0))
        self.ch = self.conn.channel()
        self.ch.confirm_delivery()

    def declare(self, queue: str | None = None, arguments: dict[str, Any] | None = None) -> str:
        queue = queue or unique()
        self.ch.queue_declare(queue, durable=True, arguments=arguments)
        return queue

    def publish(self, queue: str, n: int, start: int = 0, body_size: int = 0,
                properties: Callable[[int], pika.BasicProperties] | None = None) -> list[str]:
        """Publish n messages with bodies `m<i>` (padded to body_size) and message_id = str(i); returns
        the bodies as text."""
        bodies = []
        for i in range(start, start + n):
            body = f"m{i:07d}".ljust(body_size, ".")
            props = properties(i) if properties else pika.BasicProperties(message_id=str(i), delivery_mode=2)
            self.ch.basic_publish("", queue, body.encode(), props)
            bodies.append(body)
        return bodies

    def ready(self, queue: str) -> int:
        return int(self.ch.queue_declare(queue, passive=True).method.message_count)

    def get_all(self, queue: str, limit: int = 100_000) -> list[tuple[Any, Any, bytes]]:
        """basic.get (auto-ack) until the queue is empty."""
        out = []
        while len(out) < limit:
            method, props, body = self.ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            out.append((method, props, body))
        return out

    def close(self) -> None:
        if self.conn.is_open:
            self.conn.close()


def hutch_load(reader: Any, port: int, fmt: str = "hutch", **options: Any) -> Any:
    """`reader.format(fmt)` ("hutch"; "hutch-python" or "hutch-jvm" for one path) on the broker at `port` with `options`
    (values as strings), loaded."""
    r = reader.format(fmt).option("uri", amqp_uri(port))
    for key, value in options.items():
        r = r.option(key, str(value))
    return r.load()


def run_available_now(df: Any, out: Any, ck: Any) -> None:
    """Run a streaming read to its source's current end into Parquet files (Spark's exactly-once file
    sink) at `out`, checkpointed at `ck`; the query's failure is raised."""
    query = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(180), "the AvailableNow query did not finish"
    if query.exception() is not None:
        raise query.exception()


def declare_super_stream(broker: Broker, name: str, partitions: int) -> list[str]:
    """A super stream laid out as RabbitMQ does (its docs' AMQP 0-9-1 recipe): a direct exchange with
    `x-super-stream`, one stream per partition, bound with its index as key and partition order."""
    broker.ch.exchange_declare(name, "direct", durable=True, arguments={"x-super-stream": True})
    streams = [f"{name}-{i}" for i in range(partitions)]
    for i, stream in enumerate(streams):
        broker.ch.queue_declare(stream, durable=True, arguments={"x-queue-type": "stream"})
        broker.ch.queue_bind(stream, name, str(i), arguments={"x-stream-partition-order": i})
    return streams


def stream_messages(port: int, stream: str, expect: int, timeout: float = 60.0) -> list[tuple[Any, bytes]]:
    """(properties, body) of every message of a stream, from its first: read until `expect` messages
    came (or `timeout`), then for one more second, so that a message too many would be seen."""
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, "/",
                                                             pika.PlainCredentials("guest", "guest")))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=2000)
        got: list[tuple[Any, bytes]] = []

        def on_message(c: Any, m: Any, p: Any, body: bytes) -> None:
            got.append((p, body))
            c.basic_ack(m.delivery_tag)

        ch.basic_consume(stream, on_message, arguments={"x-stream-offset": "first"})
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            conn.process_data_events(time_limit=0.2)
        settle = time.monotonic() + 1.0
        while time.monotonic() < settle:
            conn.process_data_events(time_limit=0.2)
        return got
    finally:
        conn.close()


def wait_for(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Proxy:
    """Relays 127.0.0.1:<port> to the broker. `cut()` drops every relayed connection (as a broker that
    went away would) and refuses new ones until `restore()`; `blackhole()` stops relaying bytes without
    closing anything (a silent network)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._up = True
        self._silent = False
        self._stopped = False
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self._up:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._relay, args=(client, upstream), daemon=True).start()

    def _relay(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while not self._stopped:
                # silent: nothing is read, so select would return at once on the unread bytes: sleep
                # instead (until session 21 a silenced relay spun, a core of CPU until the run's end,
                # as its close() never ended it)
                if self._silent:
                    time.sleep(0.05)
                    continue
                readable, _, _ = select.select([a, b], [], [], 0.2)
                if self._silent:
                    continue
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    peers[s].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def connections(self) -> int:
        with self._lock:
            return sum(1 for a, _ in self._pairs if a.fileno() >= 0)

    def cut(self) -> None:
        self._up = False
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for a, b in pairs:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def blackhole(self) -> None:
        self._silent = True

    def restore(self) -> None:
        self._up = True
        self._silent = False

    def close(self) -> None:
        self._stopped = True
        self.cut()
        self.listener.close()


def parquet_offsets(spark: Any, out: Any) -> list[int]:
    """The `offset` column of the Parquet files at `out`, sorted ([] when there are none)."""
    if not any(out.glob("*.parquet")):
        return []
    return sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())


def starting_position_offsets(spark: Any, broker: Broker, stream: str, work: Any,
                              read: Callable[..., Any]) -> dict[str, list[int]]:
    """Publish 100 messages to `stream`, then 50 more a second later, and read it to its end from
    `startingOffsets` 120, from `startingTimestamp` between the two and from `latest`, each query into
    Parquet under `work`; the offsets each read (`read(**options)` makes the streaming DataFrame)."""
    broker.publish(stream, 100)
    time.sleep(1.1)  # AMQP timestamps are whole seconds: the next chunk is written at a later second
    since = int(time.time() * 1000)
    broker.publish(stream, 50, start=100)
    cases: dict[str, dict[str, Any]] = {
        "offset": {"startingOffsets": f'{{"{stream}": {{"0": 120}}}}'},
        "ts": {"startingTimestamp": since},
        "latest": {"startingOffsets": "latest"},
    }
    got = {}
    for name, opts in cases.items():
        out = work / name / "out"
        run_available_now(read(**opts), out, work / name / "ck")
        got[name] = parquet_offsets(spark, out)
    return got


def offsets_after_a_node_kill(spark: Any, work: Any, read: Callable[..., Any], source: str) -> list[int]:
    """A node with a stream of 800 messages; a query (`read(node, stream, **options)` makes its DataFrame)
    into Parquet under `work` every 300 ms; the node killed (`kill -9`) once batch 0 is written and
    restarted on new ports from its files; the query must fail naming the stream (`source`: the error's
    prefix, "hutch source" or "hutch-jvm source"); 200 more messages; the query run again to the end from
    its checkpoint. Returns the offsets in the Parquet output (each of 0..999 once, if exactly-once)."""
    node_dir = work / "node"
    node = start_server(node_dir, "--stream-port", "0")
    try:
        name = unique("st")
        b = Broker(node.amqp_port)
        try:
            b.ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
            b.publish(name, 800)
        finally:
            b.close()
        out, ck = work / "out", work / "ck"
        df = read(node, name, startingOffsets="earliest", maxOffsetsPerTrigger=200)
        query = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ck))
                 .trigger(processingTime="300 milliseconds").start())
        deadline = time.monotonic() + 120
        while not (out / "_spark_metadata" / "0").exists() and time.monotonic() < deadline:  # batch 0 done
            time.sleep(0.1)
        node.stop(signal.SIGKILL)  # the node dies during the query (its files stay)
        node = start_server(node_dir, "--stream-port", "0")  # back, on new ports
        with pytest.raises(Exception, match=re.escape(f"{source} (stream '{name}')")):
            query.awaitTermination(60)  # its next trigger (or the batch running) fails: the node went away
        query.stop()
        b = Broker(node.amqp_port)
        try:
            b.publish(name, 200, start=800)
        finally:
            b.close()
        run_available_now(read(node, name, startingOffsets="earliest"), out, ck)
        return parquet_offsets(spark, out)
    finally:
        node.stop()


def declare_stream(broker: Broker, prefix: str) -> str:
    """A new stream (its name from `prefix`), declared over AMQP 0-9-1."""
    name = unique(prefix)
    broker.ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    return name


def stream_reader(spark: Any, fmt: str, node: Any, name: str, streaming: bool = True, **options: Any) -> Any:
    """A read of stream `name` on `node` (a conftest.ServerInfo) by `fmt` ("hutch-python", "hutch-jvm" or "hutch"):
    `spark.readStream` (or `spark.read`) with the node's URI and stream port and the `options`, loaded."""
    reader = (spark.readStream if streaming else spark.read).format(fmt).option("uri", amqp_uri(node.amqp_port))
    reader = reader.option("stream", name).option("streamPort", node.ports["stream"])
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()
