"""The composition root: the only place that builds concrete runtime objects and wires them together.

Owns: building a node (`build_node`: the broker's `Node`, its definitions store, the classic message
store, the queue types in the order records are offered to them), making it clustered (`cluster_node`:
the cluster service and the queue types' inter-node services), the AMQP listener and the AMQP-over-TLS
listener with certificate reloading (runtime/tls.py), the node's life from start to SIGTERM (`serve`),
the garbage collector's tuning and the event loop (`run_node`).

Rules:
- Only `cli/server.py` (and tests that need a node in their own process) import this module.
- Everything here is wiring: behaviour lives in the layers it wires (docs/architecture.md).
- A start-up failure is one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from hutch import __version__
from hutch.config import Config
from hutch.core.auth import AuthStore
from hutch.runtime import listen
from hutch.runtime.broker.definitions import DefinitionStore
from hutch.runtime.broker.node import Node
from hutch.runtime.clock import SYSTEM_CLOCK
from hutch.runtime.clustering.service import ClusterService, load_secret
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.classic.persistence import Persistence
from hutch.runtime.queue_types.classic.queue_type import ClassicQueueType
from hutch.runtime.queue_types.delayed import DelayedMessages
from hutch.runtime.queue_types.quorum.queue_type import QuorumQueueType
from hutch.runtime.queue_types.quorum.service import QuorumService
from hutch.runtime.queue_types.remote import QueueLink
from hutch.runtime.queue_types.remote_type import RemoteQueueType
from hutch.runtime.session.protocol import AMQPProtocol
from hutch.runtime.tls import TlsConfigError
from hutch.storage.errors import StorageError
from hutch.storage.fs import DATA_UMASK

log = logging.getLogger("hutch.node")

# A service is started with the node and returns a coroutine function that stops it.
Service = Callable[[Node], Awaitable[Callable[[], Awaitable[None]]]]


def build_node(config: Config, auth: AuthStore | None = None, store: DefinitionStore | None = None,
               persistence: Persistence | None = None, monitor_resources: bool = True,
               clock: Clock = SYSTEM_CLOCK, restore: bool = True) -> Node:
    """A node with its queue types registered and, when `restore`, its saved definitions replayed (a
    clustered node is made with `restore=False` and restored by `cluster_node`'s boot instead)."""
    node = Node(config, auth=auth, store=store, monitor_resources=monitor_resources, clock=clock)
    node.persistence = persistence
    node.delayed = DelayedMessages(node, persistence)
    # records are offered in this order: a quorum queue's, a queue of another node, then this node's
    node.register_queue_type(QuorumQueueType(node, None, None))
    node.register_queue_type(ClassicQueueType(node, persistence))
    if restore:
        node.restore()
    return node


def cluster_node(node: Node, secret: bytes) -> ClusterService:
    """Make `node` a clustered node: the cluster service, the queue link to other nodes' classic queues
    and the quorum queue service, registered with the transport and as queue types."""
    cluster = ClusterService(node, secret)
    link = QueueLink(node, cluster)
    quorum = QuorumService(node, cluster)
    cluster.add_subsystem(link)
    cluster.add_subsystem(quorum)
    node.cluster = cluster
    node.queue_types = [QuorumQueueType(node, cluster, quorum), RemoteQueueType(node, link),
                        *(t for t in node.queue_types if t.name not in ("quorum", "remote"))]
    return cluster


async def start_listener(node: Node) -> asyncio.base_events.Server:
    """The AMQP listener; `node.amqp_port` is the port it got (config port 0: any free port)."""
    loop = asyncio.get_running_loop()
    cfg = node.config
    server = await listen.create_server(loop, lambda: AMQPProtocol(node), cfg.amqp_host, cfg.amqp_port,
                                        backlog=1024, reuse_address=True)
    node.server = server
    node.amqp_port = server.sockets[0].getsockname()[1]
    log.info("AMQP listener started on %s:%d", listen.display_host(cfg.amqp_host), node.amqp_port)
    return server


async def start_tls_listener(node: Node) -> asyncio.base_events.Server | None:
    """The AMQP-over-TLS listener (`listeners.ssl.default`, `ssl_options.*`) when configured: the same
    protocol behind TLS, the TLS handshake bounded by `handshake_timeout`. Sets `node.amqps_port`.
    Raises TlsConfigError (a certificate that cannot be loaded) or OSError."""
    cfg = node.config
    if cfg.amqps_port is None:
        return None
    ctx = node.tls.server_context("ssl_options")
    loop = asyncio.get_running_loop()
    server = await listen.create_server(loop, lambda: AMQPProtocol(node), cfg.amqps_host, cfg.amqps_port,
                                        ssl=ctx, ssl_handshake_timeout=cfg.handshake_timeout_ms / 1000,
                                        backlog=1024, reuse_address=True)
    node.amqps_port = server.sockets[0].getsockname()[1]
    log.info("AMQP over TLS listener started on %s:%d", listen.display_host(cfg.amqps_host), node.amqps_port)
    return server


def _cluster_tls(node: Node, cluster: ClusterService) -> None:
    """TLS between nodes (`cluster.ssl.*`) for the cluster's transport; TlsConfigError if unloadable."""
    contexts = node.tls.cluster_contexts()
    if contexts is not None:
        cluster.transport.ssl_server, cluster.transport.ssl_client = contexts


async def start_node(node: Node) -> asyncio.base_events.Server:
    """Start a built node and its AMQP listener (what tests that run a node in-process need)."""
    server = await start_listener(node)
    await node.start()
    return server


async def stop_node(node: Node, server: asyncio.base_events.Server | None) -> None:
    if server is not None:
        server.close()
    await node.stop()


def _has_cluster_identity(config: Config) -> bool:
    """Has this data directory been part of a cluster (runtime/clustering/service.py's identity file)?"""
    return bool(config.data_dir) and os.path.exists(os.path.join(config.data_dir, "cluster", "node.json"))


def _listen_error(exc: OSError) -> str:
    return "address already in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)


async def serve(config: Config, services: Sequence[Service] = (),
                prepare: Callable[[Node], str | None] | None = None) -> int:
    """Run a node. `prepare` runs after recovery and before the listeners accept clients (the CLI
    passes the management layer's definitions import for `load_definitions`); a returned text is a
    one-line start-up error."""
    clustered = config.cluster_enabled  # a cluster of one unless turned off (docs/clustering.md)
    try:
        secret = load_secret(config) if clustered else None  # refused if others can read it: one line
    except (ValueError, OSError) as exc:
        print(f"hutch-server: {exc}", file=sys.stderr)
        return 1
    try:
        # A clustered node's definitions come from the metadata Raft group; the local definitions
        # store only seeds the cluster a node founds (its first start as a clustered node).
        use_store = bool(config.data_dir) and not (clustered and (_has_cluster_identity(config)
                                                                  or config.cluster_join))
        store = DefinitionStore(config.data_dir) if use_store else None
        persistence = Persistence(config.data_dir, embed_below=config.queue_index_embed_msgs_below,
                                  segment_entries=config.queue_index_segment_entries,
                                  store_file_size_limit=config.msg_store_file_size_limit) \
            if config.data_dir else None
        node = build_node(config, store=store, persistence=persistence)
        cluster = cluster_node(node, secret) if secret is not None else None
        if cluster is None:
            node.recover_messages()
    except (StorageError, ValueError, OSError) as exc:
        print(f"hutch-server: cannot load definitions or messages from {config.data_dir}: {exc}",
              file=sys.stderr)
        return 1
    if cluster is not None:
        try:
            _cluster_tls(node, cluster)
            await cluster.start()
        except OSError as exc:
            print(f"hutch-server: cannot listen for inter-node traffic on port {config.cluster_port}: "
                  f"{_listen_error(exc)} (another node on this machine? give each its own --cluster-port, "
                  "or start with --no-cluster)", file=sys.stderr)
            await cluster.stop()
            return 1
        except ValueError as exc:
            print(f"hutch-server: {exc}", file=sys.stderr)
            await cluster.stop()
            return 1
        node.recover_messages()
    if prepare is not None:
        problem = prepare(node)
        if problem:
            print(f"hutch-server: {problem}", file=sys.stderr)
            return 1
    try:
        server = await start_listener(node)
    except OSError as exc:
        print(f"hutch-server: cannot listen for AMQP on port {config.amqp_port}: {_listen_error(exc)}",
              file=sys.stderr)
        return 1
    try:
        tls_server = await start_tls_listener(node)
    except (OSError, TlsConfigError) as exc:
        text = str(exc) if isinstance(exc, TlsConfigError) else _listen_error(exc)
        print(f"hutch-server: cannot listen for AMQP over TLS on port {config.amqps_port}: {text}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    await node.start()
    stoppers: list[Callable[[], Awaitable[None]]] = []
    if tls_server is not None:
        stoppers.append(_closer(tls_server))
    try:
        for service in services:
            stoppers.append(await service(node))
    except OSError as exc:
        what = getattr(exc, "hutch_listener", None)
        print(f"hutch-server: cannot listen for {what}: {_listen_error(exc)}" if what
              else f"hutch-server: cannot start: {_listen_error(exc)}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node.tls.start()  # certificate reloads (SIGHUP, file changes) for every TLS listener
    log.info("node %s started (hutch %s)", node.name, __version__)
    await stop.wait()
    node.tls.stop()
    log.info("node %s stopping", node.name)
    for stopper in reversed(stoppers):
        await stopper()
    await stop_node(node, server)
    if cluster is not None:
        await cluster.stop()
    log.info("node %s stopped", node.name)
    return 0


def _closer(server: asyncio.base_events.Server) -> Callable[[], Awaitable[None]]:
    async def close() -> None:
        server.close()

    return close


GC_THRESHOLDS = (100_000, 20, 10)


def tune_gc() -> None:
    """Make the cyclic garbage collector cheap for a broker's allocation pattern.

    Each message allocates a few small objects that live for milliseconds (until acked) and form no
    cycles. With CPython's default gen-0 threshold (700) those objects are scanned and promoted many
    times while in flight; with 100,000 most of them are freed by reference counting before any
    collection sees them. Measured: +10% end-to-end throughput (docs/BENCHMARKS.md), the same as with
    the collector disabled. Objects alive at start-up are frozen out of future collections.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_node(config: Config, services: Sequence[Service] = (),
             prepare: Callable[[Node], str | None] | None = None) -> int:
    """Run a node until SIGTERM/SIGINT; returns the process exit code. Sets the process umask to
    DATA_UMASK first: data at rest (bodies, password hashes) is readable by the node's user only."""
    os.umask(DATA_UMASK)
    tune_gc()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the node usable without it
        return asyncio.run(serve(config, services, prepare))
    return uvloop.run(serve(config, services, prepare))


__all__ = ["Service", "build_node", "cluster_node", "run_node", "serve", "start_node", "stop_node"]
