"""One producer or consumer OS process: its clients, its clock ticks, its half of the pipe.

Owns: `WorkerTask` (what the parent asks of a process, picklable) and `worker_main` (the process entry,
started with the 'spawn' method). A process holds `count` clients of one role, each on its own
connection, all on one uvloop event loop.

Conversation with the parent (pickled tuples over a `multiprocessing` pipe):

    worker -> parent: ("ready",)                        clients connected and set up
    parent -> worker: ("go", start_ns, stop_ns)         start at start_ns; stop at stop_ns (0: never)
    worker -> parent: ("tick", k, t_ns, totals, hist)   at start_ns + k s (and at stop_ns, last)
    worker -> parent: ("progress", totals)              a producer (-C) or consumer (-D) finished, or a
                                                        reply to poll
    parent -> worker: ("poll",) | ("stop",)
    worker -> parent: ("final", totals, hist)           after a stop from the parent
    worker -> parent: ("error", text)                   a connection failed: the run is over
    worker -> parent: ("closed",)                       connections closed, the process exits

`totals` is a `Totals` tuple of counters since "go" (cumulative); `hist` is the latency histogram of
the interval since the previous tick, in wire form. Times are CLOCK_MONOTONIC ns, which every process
on the machine shares, so ticks of all workers fall on the same boundaries.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from .consumer import ConsumePlan, Consumer
from .histogram import LatencyHistogram
from .options import AmqpUri
from .producer import Producer, PublishPlan
from .protocol import AmqpClient, AmqpClosed, CannotConnect, connect
from .report import NS, Totals


@dataclass(frozen=True)
class WorkerTask:
    role: str  # "producer" or "consumer"
    count: int
    uri: AmqpUri
    publish: PublishPlan | None = None
    consume: ConsumePlan | None = None
    targets: tuple[str, ...] = ()  # per client (--queue-pattern): a producer's routing key, a consumer's queue


def _clock_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Worker:
    def __init__(self, task: WorkerTask, pipe: Connection) -> None:
        self.task = task
        self.pipe = pipe
        self.loop = asyncio.get_running_loop()
        self.histogram = LatencyHistogram()
        self.producers: list[Producer] = []
        self.consumers: list[Consumer] = []
        self.finished: asyncio.Future[None] = self.loop.create_future()
        self.go: asyncio.Future[tuple[int, int]] = self.loop.create_future()
        self.baseline = Totals()
        self.start_ns = 0
        self.stop_ns = 0
        self.tick = 0
        self.stopped = False
        self.pending: set[asyncio.Task[None]] = set()
        self.made = 0  # clients made so far: the index into task.targets

    @property
    def clients(self) -> list[AmqpClient]:
        return [*self.producers, *self.consumers]

    def send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):
            self.pipe.send(message)

    def make_client(self) -> AmqpClient:
        task = self.task
        k, self.made = self.made, self.made + 1
        if task.role == "producer":
            assert task.publish is not None
            plan = replace(task.publish, routing_key=task.targets[k]) if task.targets else task.publish
            return Producer(task.uri, plan, on_done=self.on_client_done, on_error=self.on_error)
        assert task.consume is not None
        consume = replace(task.consume, queue=task.targets[k]) if task.targets else task.consume
        return Consumer(task.uri, consume, self.histogram, on_error=self.on_error,
                        on_done=self.on_client_done)

    async def run(self) -> None:
        self.loop.add_reader(self.pipe.fileno(), self.on_pipe)
        results = await asyncio.gather(*(connect(self.task.uri, self.make_client)
                                         for _ in range(self.task.count)), return_exceptions=True)
        clients = [r for r in results if isinstance(r, AmqpClient)]
        self.producers = [c for c in clients if isinstance(c, Producer)]
        self.consumers = [c for c in clients if isinstance(c, Consumer)]
        failures = [r for r in results if not isinstance(r, AmqpClient)]
        if not failures:
            setups = await asyncio.gather(*(c.setup() for c in clients), return_exceptions=True)
            failures = [r for r in setups if isinstance(r, BaseException)]
        if failures:
            exc = failures[0]
            if isinstance(exc, CannotConnect):
                text = f"cannot connect to {self.task.uri.display()}: {exc}"
            else:
                text = f"{self.task.role} setup failed: {exc}"
            self.send(("error", text))
            await self.close_all()
            return
        self.send(("ready",))
        start_ns, stop_ns = await self.go
        if not self.stopped:
            self.start(start_ns, stop_ns)
            await self.finished
        await self.close_all()

    def start(self, start_ns: int, stop_ns: int) -> None:
        self.start_ns = start_ns
        self.stop_ns = stop_ns
        for consumer in self.consumers:
            consumer.start_ns = start_ns
        self.take_baseline(reset_histogram=True)
        delay_s = max(0.0, (start_ns - _clock_ns()) / NS)
        # deliveries before the start instant (a backlog in a named queue) are not counted: the run's
        # duration starts there
        self.loop.call_later(delay_s, self.take_baseline)
        for producer in self.producers:
            self.loop.call_later(delay_s, self.start_producer, producer)
        for consumer in self.consumers:
            if consumer.plan.consume_at_start:
                self.loop.call_later(delay_s, self.start_consumer, consumer)
        self.schedule_tick()

    def start_consumer(self, consumer: Consumer) -> None:
        if not self.stopped:
            task = self.loop.create_task(self.consume(consumer))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def consume(self, consumer: Consumer) -> None:
        try:
            await consumer.consume()
        except AmqpClosed as exc:
            self.on_error(exc)

    def take_baseline(self, reset_histogram: bool = False) -> None:
        """What happened before the start instant is not the run's. The consumers' share is what arrived
        before the instant by the clock (`received_before_start`), not what they had received when this
        timer ran: on a loaded machine the loop runs due I/O before due timers, so deliveries of the run
        itself (up to a prefetch of them) could be taken for a backlog. Their latencies are not recorded
        at all before the instant, so the histogram is reset only before "go" (`reset_histogram`)."""
        if not self.stopped and self.tick == 0:
            raw = self.totals(raw=True)
            self.baseline = raw._replace(received=sum(c.received_before_start for c in self.consumers))
            if reset_histogram:
                self.histogram.reset()

    def start_producer(self, producer: Producer) -> None:
        if not self.stopped:  # a stop may arrive between "go" and the start instant
            producer.start()

    def schedule_tick(self) -> None:
        due_ns = self.start_ns + (self.tick + 1) * NS
        if self.stop_ns and due_ns > self.stop_ns:
            due_ns = self.stop_ns
        self.loop.call_later(max(0.0, (due_ns - _clock_ns()) / NS), self.on_tick, due_ns)

    def on_tick(self, due_ns: int) -> None:
        if self.stopped:
            return
        self.tick += 1
        last = bool(self.stop_ns) and due_ns >= self.stop_ns
        if last:
            self.stop_clients()
        self.send(("tick", self.tick, due_ns - self.start_ns, self.totals(), self.take_histogram()))
        if last:
            self.finish()
        else:
            self.schedule_tick()

    def totals(self, raw: bool = False) -> Totals:
        ps, cs = self.producers, self.consumers
        total = Totals(
            sum(p.sent for p in ps), sum(p.confirmed for p in ps), sum(p.nacked for p in ps),
            sum(p.returned for p in ps), sum(c.received for c in cs), sum(p.done for p in ps),
            sum(c.done for c in cs), max((c.last_activity_ns for c in self.clients), default=0),
        )
        return total if raw else total.minus(self.baseline)

    def take_histogram(self) -> Any:
        wire = self.histogram.to_wire()
        self.histogram.reset()
        return wire

    def stop_clients(self) -> None:
        self.stopped = True
        for client in self.clients:
            client.stop()

    def finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
        if not self.go.done():
            self.go.set_result((0, 0))

    async def close_all(self) -> None:
        await asyncio.gather(*(c.close() for c in self.clients), return_exceptions=True)

    # -- events -------------------------------------------------------------------------------------

    def on_pipe(self) -> None:
        try:
            while self.pipe.poll():
                self.on_message(self.pipe.recv())
        except (EOFError, OSError):  # the parent is gone: stop quietly
            self.loop.remove_reader(self.pipe.fileno())
            self.stop_clients()
            self.finish()

    def on_message(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "go" and not self.go.done():
            self.go.set_result((message[1], message[2]))
        elif kind == "poll":
            self.send(("progress", self.totals()))
        elif kind == "stop" and not self.stopped:
            self.stop_clients()
            if self.start_ns:
                self.send(("final", self.totals(), self.take_histogram()))
            self.finish()

    def on_client_done(self) -> None:
        self.send(("progress", self.totals()))

    def on_error(self, exc: AmqpClosed) -> None:
        if not self.stopped:
            self.send(("error", f"{self.task.role} connection failed: {exc}"))
            self.stop_clients()
            self.finish()


def worker_main(task: WorkerTask, pipe: Connection) -> None:
    """Process entry point (spawned). Ctrl-C goes to the whole process group: the parent handles it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    async def main() -> None:
        await Worker(task, pipe).run()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        asyncio.run(main())
    else:
        uvloop.run(main())
    with contextlib.suppress(OSError):
        pipe.send(("closed",))
    pipe.close()
