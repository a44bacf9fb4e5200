"""The parent process: topology, worker processes, the per-second lines and the summary.

Owns: `run(options, out, err) -> exit status`.

Sequence: declare the queue (and exchange/binding) on a short-lived connection of its own (a queue named
with `--queue` that exists is used as it is: checked with a passive declare, so a durable queue declared
beforehand works; `--queue-args` makes it a real declare, and the broker checks them); spawn the
worker processes ('spawn' start method: a clean interpreter, no inherited event loop or sockets); wait
until every worker is connected and consuming; send "go" with a start instant 100 ms ahead so that
all producers start together (in a run without producers, a drain of a backlog, the consumers subscribe
at that instant instead, so that the drain is measured from its first delivery); then only read the
pipes and print. The parent does no AMQP work during the measured time, so it takes no CPU from the
clients or the broker beyond one wake-up per report.

End of a run: at `--time` the workers stop themselves on their own clock (the last tick); with
`--pmessages` and/or `--cmessages` the parent stops everyone once all producers and all consumers are
done (see `Run.check_counts`); Ctrl-C stops everyone at once. Finally the queue (unless `--queue` named
it) and an exchange hutch-perf declared are deleted.

Process layout: producers are spread over at most `--processes` (default: CPU count) producer
processes, consumers likewise; a process never mixes roles, so a slow consumer loop never delays
publishing and vice versa.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import Coroutine
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import Any, TextIO, TypeVar

from hutch.amqp import spec

from .consumer import ConsumePlan
from .options import PerfOptions, cpu_count
from .producer import PublishPlan
from .protocol import AmqpClient, AmqpClosed, CannotConnect, connect
from .report import NS, Collector
from .worker import WorkerTask, worker_main

START_DELAY_NS = 100_000_000
READY_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 0.05
DRAIN_STALL_S = 3.0
T = TypeVar("T")


def _clock_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(coro)
    return uvloop.run(coro)


def split(total: int, groups: int) -> list[int]:
    """Spread `total` clients over at most `groups` processes, as evenly as possible."""
    groups = min(total, max(1, groups))
    if total <= 0:
        return []
    base, extra = divmod(total, groups)
    return [base + (1 if i < extra else 0) for i in range(groups)]


# -- topology -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Topology:
    queue: str
    routing_key: str
    delete_queue: bool
    delete_exchange: bool
    queues: tuple[str, ...] = ()  # with --queue-pattern: every queue of the run (`queue` is the first)

    @property
    def all_queues(self) -> tuple[str, ...]:
        return self.queues or (self.queue,)


async def _exists(client: AmqpClient, method: spec.Method, reply: type) -> bool:
    """Passive declare: True if it exists; on 404 reopen the channel the server closed and say False."""
    try:
        await client.call(1, method, reply)
        return True
    except AmqpClosed as exc:
        if exc.code != 404:
            raise
        await client.open_channel(1)
        return False


def _binding_key(opts: PerfOptions, queue: str, routing_key: str) -> str:
    """A pattern queue is bound with its own name unless -k gives the key."""
    if opts.routing_key is not None:
        return opts.routing_key
    return queue if opts.queue_pattern else routing_key


async def declare_topology(opts: PerfOptions, queue: str, routing_key: str) -> Topology:
    client = await connect(opts.uri, lambda: AmqpClient(opts.uri))
    try:
        await client.open_channel(1)
        if opts.queue_pattern is not None:
            return await _declare_pattern(client, opts)
        named = opts.queue is not None
        # a named queue that exists is used as it is (durable or not), unless the command line asked for
        # specific properties: then it is declared, and a broker's 406 is the answer
        if not (named and not opts.queue_args
                and await _exists(client, spec.Queue.Declare(queue=queue, passive=True), spec.Queue.DeclareOk)):
            declare = spec.Queue.Declare(queue=queue, durable=opts.quorum, auto_delete=False,
                                         arguments=opts.queue_args or None)
            await client.call(1, declare, spec.Queue.DeclareOk)
        topology = Topology(queue, routing_key, delete_queue=not named, delete_exchange=False)
        if opts.exchange:
            try:
                if not await _exists(client, spec.Exchange.Declare(exchange=opts.exchange, passive=True),
                                     spec.Exchange.DeclareOk):
                    await client.call(1, spec.Exchange.Declare(exchange=opts.exchange, type=opts.exchange_type),
                                      spec.Exchange.DeclareOk)
                    topology = replace(topology, delete_exchange=True)
                await client.call(1, spec.Queue.Bind(queue=queue, exchange=opts.exchange, routing_key=routing_key),
                                  spec.Queue.BindOk)
            except AmqpClosed:
                if not client.closed.done():  # the run will not happen: leave nothing behind
                    await client.open_channel(1)
                    await _delete(client, opts, topology)
                raise
        return topology
    finally:
        await client.close()


async def _declare_pattern(client: AmqpClient, opts: PerfOptions) -> Topology:
    """--queue-pattern: every queue declared (and deleted at the end), each bound to -e if given."""
    queues = opts.pattern_queues()
    topology = Topology(queues[0], queues[0], delete_queue=True, delete_exchange=False, queues=queues)
    try:
        if opts.exchange and not await _exists(client, spec.Exchange.Declare(exchange=opts.exchange, passive=True),
                                               spec.Exchange.DeclareOk):
            await client.call(1, spec.Exchange.Declare(exchange=opts.exchange, type=opts.exchange_type),
                              spec.Exchange.DeclareOk)
            topology = replace(topology, delete_exchange=True)
        for q in queues:
            await client.call(1, spec.Queue.Declare(queue=q, durable=opts.quorum, auto_delete=False,
                                                    arguments=opts.queue_args or None), spec.Queue.DeclareOk)
            if opts.exchange:
                await client.call(1, spec.Queue.Bind(queue=q, exchange=opts.exchange,
                                                     routing_key=_binding_key(opts, q, q)), spec.Queue.BindOk)
    except AmqpClosed:
        if not client.closed.done():  # the run will not happen: leave nothing behind
            await client.open_channel(1)
            await _delete(client, opts, topology)
        raise
    return topology


async def _delete(client: AmqpClient, opts: PerfOptions, topology: Topology) -> None:
    if topology.delete_queue:
        for q in topology.all_queues:
            await client.call(1, spec.Queue.Delete(queue=q), spec.Queue.DeleteOk)
    if topology.delete_exchange:
        await client.call(1, spec.Exchange.Delete(exchange=opts.exchange), spec.Exchange.DeleteOk)


async def delete_topology(opts: PerfOptions, topology: Topology) -> None:
    if not topology.delete_queue and not topology.delete_exchange:
        return
    client = await connect(opts.uri, lambda: AmqpClient(opts.uri))
    try:
        await client.open_channel(1)
        await _delete(client, opts, topology)
    finally:
        await client.close()


# -- the run ------------------------------------------------------------------------------------------

def make_tasks(opts: PerfOptions, topology: Topology) -> list[WorkerTask]:
    per_role = opts.processes or cpu_count()
    publish = PublishPlan(exchange=opts.exchange, routing_key=topology.routing_key, size_bytes=opts.size_bytes,
                          mandatory=opts.mandatory, persistent=opts.persistent,
                          confirm_window=opts.confirm_window, rate=opts.rate, limit=opts.pmessages,
                          priorities=opts.priorities)
    consume = ConsumePlan(queue=topology.queue, qos=opts.qos, autoack=opts.autoack,
                          multi_ack_every=opts.multi_ack_every, limit=opts.cmessages,
                          consume_at_start=opts.producers == 0)
    queues = topology.queues
    keys = tuple(_binding_key(opts, q, topology.routing_key) for q in queues)
    tasks, first = [], 0
    for n in split(opts.producers, per_role):  # with a pattern: producer k publishes to queue k mod count
        targets = tuple(keys[(first + k) % len(keys)] for k in range(n)) if queues else ()
        tasks.append(WorkerTask("producer", n, opts.uri, publish=publish, targets=targets))
        first += n
    first = 0
    for n in split(opts.consumers, per_role):  # and consumer k consumes queue k mod count
        targets = tuple(queues[(first + k) % len(queues)] for k in range(n)) if queues else ()
        tasks.append(WorkerTask("consumer", n, opts.uri, consume=consume, targets=targets))
        first += n
    return tasks


class Run:
    """The parent's view of one run: worker pipes, their state, and when to stop."""

    def __init__(self, opts: PerfOptions, tasks: list[WorkerTask], lines: TextIO, copies: int = 1) -> None:
        self.opts = opts
        self.copies = copies  # deliveries per routed message (a fanout to the run's queues)
        self.tasks = tasks
        self.lines = lines
        self.ctx = multiprocessing.get_context("spawn")
        self.procs: list[Any] = []
        self.pipes: dict[int, Connection] = {}
        self.ready: set[int] = set()
        self.collector = Collector(list(range(len(tasks))), opts.run_id)
        self.error: str | None = None
        self.start_ns = 0
        self.stop_ns = 0  # when the parent stopped the run (0: it did not)
        self.interrupted = False
        self.drain_received = -1
        self.drain_since_ns = 0
        self.next_poll_ns = 0

    @property
    def counted(self) -> bool:
        """The run ends on message counts (-C / -D), not only on time."""
        return bool(self.opts.pmessages or self.opts.cmessages)

    def spawn(self) -> None:
        for i, task in enumerate(self.tasks):
            parent_end, child_end = self.ctx.Pipe()
            proc = self.ctx.Process(target=worker_main, args=(task, child_end), daemon=True,
                                    name=f"hutch-perf-{task.role}-{i}")
            proc.start()
            child_end.close()
            self.procs.append(proc)
            self.pipes[i] = parent_end

    def broadcast(self, message: tuple[Any, ...], role: str | None = None) -> None:
        for i, pipe in list(self.pipes.items()):
            if role is None or self.tasks[i].role == role:
                try:
                    pipe.send(message)
                except OSError:
                    pass

    def stop(self) -> None:
        if not self.stop_ns:
            self.stop_ns = _clock_ns()
            self.collector.muted = True
            self.broadcast(("stop",))

    def fail(self, text: str) -> None:
        if self.error is None:
            self.error = text
        self.stop()

    def emit(self, lines: list[str]) -> None:
        for line in lines:
            print(line, file=self.lines, flush=True)

    def handle(self, i: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "tick":
            self.emit(self.collector.on_tick(i, message[1], message[2], message[3], message[4]))
        elif kind == "progress":
            self.collector.on_progress(i, message[1])
        elif kind == "final":
            self.emit(self.collector.on_final(i, message[1], message[2]))
        elif kind == "ready":
            self.ready.add(i)
        elif kind == "error":
            self.fail(message[1])
        elif kind == "closed":
            self.drop(i)

    def drop(self, i: int) -> None:
        pipe = self.pipes.pop(i, None)
        if pipe is not None:
            pipe.close()
        self.emit(self.collector.on_gone(i))

    def pump(self, timeout_s: float) -> None:
        """Read every message that arrives within timeout_s."""
        by_pipe = {id(p): i for i, p in self.pipes.items()}
        for pipe in wait(list(self.pipes.values()), timeout_s):
            assert isinstance(pipe, Connection)  # wait() hands back the pipes it was given
            i = by_pipe[id(pipe)]
            try:
                while pipe.poll():
                    self.handle(i, pipe.recv())
                    if i not in self.pipes:
                        break
            except (EOFError, OSError):
                if i in self.pipes:
                    code = self.procs[i].exitcode
                    self.drop(i)
                    self.fail(f"{self.tasks[i].role} process {i} exited unexpectedly (exit code {code})")

    def check_counts(self) -> None:
        """With -C and/or -D: stop once all producers and all consumers are done.

        Producers are done when there are none, or with -C when each sent and settled its N (without
        -C they are never done). Consumers are done when there are none; with -D when each received
        its N; without -D once the producers are done and the consumers have received what was routed,
        `copies` deliveries per message (a fanout exchange's run counts one per queue), or have received
        nothing new for DRAIN_STALL_S."""
        opts = self.opts
        if not (opts.pmessages or opts.cmessages) or self.stop_ns or not self.start_ns:
            return
        totals = self.collector.totals
        if opts.producers and (not opts.pmessages or totals.producers_done < opts.producers):
            return
        if opts.consumers == 0:
            self.stop()
            return
        if opts.cmessages:
            if totals.consumers_done >= opts.consumers:
                self.stop()
            return
        now = _clock_ns()
        if totals.received >= (totals.sent - totals.returned) * self.copies:
            self.stop()
        elif totals.received != self.drain_received:
            self.drain_received = totals.received
            self.drain_since_ns = now
        elif now - self.drain_since_ns > DRAIN_STALL_S * NS:
            self.stop()
        if not self.stop_ns:
            self.poll_consumers()

    def poll_consumers(self) -> None:
        now = _clock_ns()
        if now >= self.next_poll_ns:
            self.next_poll_ns = now + int(POLL_INTERVAL_S * NS)
            self.broadcast(("poll",), role="consumer")

    def on_sigint(self, signum: int, frame: Any) -> None:
        self.interrupted = True
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C aborts

    def execute(self) -> None:
        self.spawn()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.pipes and len(self.ready) < len(self.tasks) and self.error is None:
            if self.interrupted or time.monotonic() > deadline:
                self.fail("interrupted" if self.interrupted else "workers did not get ready in time")
                break
            self.pump(0.1)
        if self.error is None and len(self.ready) == len(self.tasks):
            self.start_ns = _clock_ns() + START_DELAY_NS
            stop_at = self.start_ns + int(self.opts.time_s * NS) if self.opts.time_s else 0
            self.broadcast(("go", self.start_ns, stop_at))
        shutdown_deadline = 0.0
        while self.pipes:
            if self.interrupted:
                self.stop()
            self.pump(POLL_INTERVAL_S if self.counted else 0.2)
            self.check_counts()
            if self.stop_ns and not shutdown_deadline:
                shutdown_deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
            if shutdown_deadline and time.monotonic() > shutdown_deadline:
                break
        self.join()

    def join(self) -> None:
        for proc in self.procs:
            proc.join(timeout=SHUTDOWN_TIMEOUT_S if proc.is_alive() else 0)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=2)

    def duration_s(self) -> float:
        if not self.start_ns:
            return 0.0
        if not self.stop_ns:
            return self.opts.time_s
        if self.counted and not self.interrupted and self.error is None:
            end = self.collector.totals.last_activity_ns or self.stop_ns
            return max(0.0, (min(end, self.stop_ns) - self.start_ns) / NS)
        return max(0.0, (self.stop_ns - self.start_ns) / NS)


def run(opts: PerfOptions, out: TextIO, err: TextIO) -> int:
    """Run a benchmark; return the exit status (0 done, 1 broker or worker failure)."""
    lines = err if opts.json else out
    queue = opts.queue_name(os.getpid())
    routing_key = opts.routing_key if opts.routing_key is not None else queue
    try:
        topology = run_async(declare_topology(opts, queue, routing_key))
    except CannotConnect as exc:
        print(f"hutch-perf: cannot connect to {opts.uri.display()}: {exc}", file=err)
        return 1
    except AmqpClosed as exc:
        print(f"hutch-perf: cannot declare the queue or exchange: {exc}", file=err)
        return 1
    copies = len(topology.all_queues) if opts.exchange and opts.exchange_type == "fanout" else 1
    run_ = Run(opts, make_tasks(opts, topology), lines, copies)
    previous = signal.signal(signal.SIGINT, run_.on_sigint)
    try:
        run_.execute()
    finally:
        signal.signal(signal.SIGINT, previous)
        try:
            run_async(delete_topology(opts, topology))
        except (CannotConnect, AmqpClosed) as exc:
            print(f"hutch-perf: warning: could not delete {topology.queue}: {exc}", file=err)
    if run_.error is not None:
        print(f"hutch-perf: {run_.error}", file=err)
        return 1
    summary = run_.collector.summary(run_.duration_s(), opts.confirm_window > 0, _config(opts, topology))
    for line in summary.lines():
        print(line, file=lines, flush=True)
    if opts.json:
        print(summary.to_json(), file=out, flush=True)
    return 0


def _config(opts: PerfOptions, topology: Topology) -> dict[str, Any]:
    return {
        "uri": opts.uri.display(), "producers": opts.producers, "consumers": opts.consumers,
        "size_bytes": opts.size_bytes, "confirm_window": opts.confirm_window, "qos": opts.qos,
        "multi_ack_every": opts.multi_ack_every, "autoack": opts.autoack, "persistent": opts.persistent,
        "queue": topology.queue, "queues": len(topology.all_queues), "quorum": opts.quorum, "rate_limit": opts.rate,
        "pmessages": opts.pmessages, "cmessages": opts.cmessages,
    }
