"""What all stream-protocol connections of a node share: the `StreamHub`.

Owns: the broker and stream catalog ports the connections use, the node's single-active-consumer groups
(sac.py) and their router (sac_router.py: groups of replicated streams live on the writer's node), the set of open stream connections (to tell the others when a stream they use is deleted,
and for listing), the host and port the metadata command advertises, and `StreamCounters`, the node's
message counters of the protocol (Prometheus' rabbitmq_global_* with protocol="stream").

Rule: built once by the composition root (runtime/app.py) and handed to every connection; nothing here
does IO.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


class StreamHub:
    def __init__(self, broker: BrokerPort, catalog: StreamCatalog) -> None:
        self.broker = broker
        self.catalog = catalog
        self.counters = StreamCounters()
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
