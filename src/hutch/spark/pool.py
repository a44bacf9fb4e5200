"""Stream-protocol connections kept for reuse within one Python process of Spark's.

Owns: `StreamClientPool` and the process's pool (`POOL`, closed at exit), `pooled_on()` (a connection to
one of the nodes the `metadata` command names for a stream: its leader to write, a member to read), and
`pooled()`, the one way the
connector takes a stream-protocol connection: a context manager that checks a connection out (a kept one
that still works, or a new one) and gives it back when the block ends cleanly, or closes it when the
block failed.

Why: Spark runs a read task, a sink task and a trigger's probes as short calls in long-lived processes
(the driver's source runner lives as long as the query; executors' Python workers are reused from task
to task, `spark.python.worker.reuse`). A connection per call costs a TCP (and TLS) handshake, SASL,
tune and open per trigger, per partition probe and per task; measured, that was most of the
connector's share of a pipeline (docs/BENCHMARKS.md, "Spark on streams").

Rules:
- Several hosts (the `hosts` option): `take` is given the addresses in order; a kept connection to any
  of them is taken first, else each is connected to in turn until one answers (spark/hosts.py).
- Keyed by everything that makes a connection: host, port, user, password, vhost, TLS settings (the
  `AmqpUri`, frozen). A connection is used by one caller at a time (checked out), so the driver's
  concurrent probes of a super stream's partitions take one each.
- A connection goes back only when its user is done with it cleanly: no subscription open, no publisher
  declared (`StreamClient.in_use`); otherwise, or after any exception, it is closed.
- A kept connection is checked before it is handed out (`StreamClient.alive`: heartbeats that came
  while it sat idle are answered; a broker that closed it or went away is noticed): a dead one is closed
  and another is opened, so a node restart costs one new connection, never a failed task.
- Bounded: at most `MAX_IDLE_PER_KEY` idle connections per key; one given back beyond that is closed.
  Every idle connection is closed at the process's exit (`atexit`).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import replace

from hutch.amqp.uri import AmqpUri

from .hosts import first_answering
from .streamclient import StreamClient, StreamClientError

MAX_IDLE_PER_KEY = 16


class StreamClientPool:
    def __init__(self, max_idle_per_key: int = MAX_IDLE_PER_KEY) -> None:
        self.max_idle_per_key = max_idle_per_key
        self._idle: dict[AmqpUri, list[StreamClient]] = {}
        self._lock = threading.Lock()
        self.opened = 0  # connections opened over the pool's life (tests and the benchmark read it)

    def take(self, uris: AmqpUri | Sequence[AmqpUri], name: str, timeout_s: float) -> StreamClient:
        """A working connection to one of `uris` (in order of preference): a kept one, else a new one to
        the first that answers (StreamClientError naming every address tried if none does)."""
        every = (uris,) if isinstance(uris, AmqpUri) else tuple(uris)
        for uri in every:
            while True:
                with self._lock:
                    kept = self._idle.get(uri)
                    client = kept.pop() if kept else None
                if client is None:
                    break
                if client.alive():
                    client.timeout_s = timeout_s
                    return client
                client.close()
        client = first_answering(every, lambda uri: StreamClient(uri, name, timeout_s=timeout_s).connect(),
                                 StreamClientError)
        with self._lock:
            self.opened += 1
        return client

    def give_back(self, client: StreamClient) -> None:
        if client.in_use():
            client.close()
            return
        with self._lock:
            kept = self._idle.setdefault(client.uri, [])
            if len(kept) < self.max_idle_per_key:
                kept.append(client)
                return
        client.close()

    def idle(self, uri: AmqpUri | None = None) -> int:
        """Idle connections kept (to `uri`, or in all)."""
        with self._lock:
            return len(self._idle.get(uri, ())) if uri is not None else sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        """Close every idle connection (checked-out ones close when their users give them back)."""
        with self._lock:
            every = [client for kept in self._idle.values() for client in kept]
            self._idle.clear()
        for client in every:
            client.close()


POOL = StreamClientPool()
atexit.register(POOL.close)


@contextmanager
def pooled(uri: AmqpUri | Sequence[AmqpUri], name: str, timeout_s: float) -> Iterator[StreamClient]:
    """A connection of the process's pool (to the first of `uri` that answers) for the block: given back when it ends cleanly, closed when it
    raises (or when the block left a subscription or a publisher open)."""
    client = POOL.take(uri, name, timeout_s)
    try:
        yield client
    except BaseException:
        client.close()
        raise
    POOL.give_back(client)


def pooled_on(stack: ExitStack, client: StreamClient, nodes: Sequence[tuple[str, int]], name: str,
              timeout_s: float) -> StreamClient | None:
    """A connection to one of `nodes` (advertised (host, stream port) pairs, in order of preference) for
    the rest of `stack`: `client` itself when its node is one of them (or none is named), else one of the
    pool to the first that answers (credentials, vhost and TLS from `client`); None when none answers."""
    if not nodes or client.advertised in nodes:
        return client
    uris = [replace(client.uri, host=host, port=port) for host, port in nodes]
    try:
        return stack.enter_context(pooled(uris, name, timeout_s))
    except StreamClientError as exc:
        if exc.code != 0:
            raise
        return None


__all__ = ["MAX_IDLE_PER_KEY", "POOL", "StreamClientPool", "pooled", "pooled_on"]
