"""What all stream-protocol connections of a node share: the `StreamHub`.

Owns: the broker and stream catalog ports the connections use, the node's single-active-consumer groups
(sac.py) and their router (sac_router.py: groups of replicated streams live on the writer's node), the set of open stream connections (to tell the others when a stream they use is deleted,
and for listing), the host and port the metadata command advertises, `StreamCounters`, the node's
message counters of the protocol (Prometheus' rabbitmq_global_* with protocol="stream"), and
`PropertiesBudget`, the bytes subscriptions keep for their properties (per connection and in all).

Rule: built once by the composition root (runtime/app.py) and handed to every connection; nothing here
does IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hutch.core.logsafe import LogThrottle
from hutch.runtime.ports import BrokerPort
from hutch.runtime.stream_session.home_link import StreamReaderLink
from hutch.runtime.stream_session.ports import StreamCatalog, StreamHandover
from hutch.runtime.stream_session.sac import SacGroups
from hutch.runtime.stream_session.sac_router import SacRouter


@dataclass
class StreamCounters:
    """Messages over the stream protocol since the node started, over every connection and publisher that
    ever was. Invariant: they never go down (a closed connection's counts stay in them)."""

    messages_received: int = 0  # publishing ids in publish frames of known publishers
    messages_confirmed: int = 0  # publishing ids confirmed (stored, or deduplicated)
    messages_errored: int = 0  # publishing ids answered with a publish error
    messages_delivered: int = 0  # records in the chunks delivered to subscriptions


class PropertiesBudget:
    """The bytes the subscriptions of this process keep for their properties and filter values (a
    subscribe may carry ~45,000 `filter.N` in a 1 MiB frame: ~10 MiB kept; a connection may hold 255
    subscriptions). A connection keeps at most `connection_max` bytes; of what it keeps, its first
    `FREE_BYTES` are its own (never refused for the others: a flood of connections cannot lock out a
    client of a few ordinary subscriptions), and the part beyond them counts against `total_max` for
    all the connections together. `admit` answers why a subscription of `cost` more bytes is refused
    (None: it is taken); `release` gives them back. Pure: the connection keeps its own count.

    Invariant: `beyond_free` == the sum over connections of max(0, kept - FREE_BYTES) <= `total_max`."""

    FREE_BYTES = 1 << 20  # ~4,000 filter values; rstream's test uses 3,000, real filters a handful

    def __init__(self, connection_max: int, total_max: int) -> None:
        assert connection_max > 0 and total_max >= 0
        self.connection_max = connection_max
        self.total_max = total_max
        self.free = min(self.FREE_BYTES, connection_max)
        self.beyond_free = 0
        self.refusals_log = LogThrottle()  # one line a refusal, at most 20 per 10 s (core/logsafe.py)

    def _beyond(self, kept: int) -> int:
        return max(0, kept - self.free)

    def room(self, kept: int) -> int:
        """The bytes a connection keeping `kept` may take now: what its own cap leaves, and of that
        what its first `free` bytes and the others' total leave."""
        assert kept >= 0
        total_left = self.total_max - self.beyond_free + max(0, self.free - kept)
        return max(0, min(self.connection_max - kept, total_left))

    def admit(self, kept: int, cost: int) -> str | None:
        """Take `cost` more bytes for a connection keeping `kept`; else why not (nothing is taken)."""
        assert kept >= 0 and cost >= 0
        if kept + cost > self.connection_max:
            return (f"its subscriptions' properties would keep {kept + cost} bytes, over the connection's "
                    f"{self.connection_max} (stream.max_subscription_properties_bytes)")
        if cost > self.room(kept):
            return (f"the subscriptions' properties of all connections would keep more than {self.total_max} "
                    f"bytes beyond each connection's first {self.free} "
                    "(stream.max_subscription_properties_bytes_total)")
        self.beyond_free += self._beyond(kept + cost) - self._beyond(kept)
        assert 0 <= self.beyond_free <= self.total_max
        return None

    def release(self, kept: int, cost: int) -> None:
        """A subscription of `cost` bytes ended on a connection that kept `kept` with it."""
        assert 0 <= cost <= kept
        self.beyond_free -= self._beyond(kept) - self._beyond(kept - cost)
        assert self.beyond_free >= 0


class StreamHub:
    def __init__(self, broker: BrokerPort, catalog: StreamCatalog) -> None:
        self.broker = broker
        self.catalog = catalog
        self.counters = StreamCounters()
        cfg = broker.config
        self.properties = PropertiesBudget(cfg.stream_max_subscription_properties_bytes,
                                           cfg.stream_max_subscription_properties_bytes_total)
        self.sac = SacGroups()  # the groups that live on this node
        self.sac_router = SacRouter(self.sac, catalog)  # where each subscription's group lives
        self.reader_link = StreamReaderLink(catalog)  # streams whose copy is another worker's (started
        #                                               with the worker link, runtime/app.py)
        self.connections: set[Any] = set()
        # the streams whose deletion is watched (one callback per stream handle; see `watch`)
        self._watched: dict[tuple[str, str], Any] = {}
        self.port = 0       # the plain listener's bound port (set when it listens)
        self.tls_port = 0   # the TLS listener's bound port
        self.own_port = 0   # a worker's own plain listener (`workers.own_ports`), advertised on itself
        self.own_tls_port = 0  # a worker's own TLS listener (`workers.own_ports`), advertised on itself
        self.handover: StreamHandover | None = None  # a worker's connection locality (`workers.locality`)

    def watch(self, vhost: str, stream: str, handle: Any) -> None:
        """Tell the connections as soon as this stream is deleted by any path (AMQP 0-9-1, management),
        not only at their next publish or delivery: RabbitMQ sends the metadata update at once."""
        key = (vhost, stream)
        if self._watched.get(key) is handle:
            return
        self._watched[key] = handle

        def deleted() -> None:
            if self._watched.get(key) is handle:
                del self._watched[key]
            self.stream_deleted(vhost, stream)
        handle.on_delete(deleted)

    def stream_deleted(self, vhost: str, stream: str) -> None:
        """Every connection with a publisher or a subscription on the stream is told it is gone."""
        for conn in list(self.connections):
            conn.stream_gone(vhost, stream)
