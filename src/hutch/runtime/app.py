"""The composition root: the only place that builds concrete runtime objects and wires them together.

Owns: building a node (`build_node`: the broker's `Node`, its definitions store, the classic message
store, the queue types in the order records are offered to them), making it clustered (`cluster_node`:
the cluster service and the queue types' inter-node services), the AMQP listener and the AMQP-over-TLS
listener with certificate reloading (runtime/tls.py), the stream protocol's listeners and streams
(`start_streams`), the node's life from start to SIGTERM (`serve`), announcing the ports its listeners
bound (the log and the ports file, hutch/portfile.py), the garbage collector's tuning and the event
loop (`run_node`). In a worker process (`worker`, runtime/workers/), the same node is one worker of
several: its listeners share the node's ports (`SO_REUSEPORT`), its cluster transport is the paired
worker link, and it reports to the supervisor (heartbeats, its ports) over its control socket.

Rules:
- Only `cli/server.py` (and tests that need a node in their own process) import this module.
- Everything here is wiring: behaviour lives in the layers it wires (docs/architecture.md).
- A start-up failure is one line on stderr and exit code 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

from hutch import __version__, portfile
from hutch.cluster.messages import DirectReply, LimitAcquire, LimitCounts, LimitQuery
from hutch.config import Config
from hutch.core.auth import AuthStore
from hutch.runtime import listen
from hutch.runtime.agent import LocalAgent
from hutch.runtime.agent_link import node_agent, serve_agent
from hutch.runtime.broker import limits
from hutch.runtime.broker.definitions import DefinitionStore
from hutch.runtime.broker.node import Node
from hutch.runtime.clock import SYSTEM_CLOCK
from hutch.runtime.clustering.service import ClusterService, load_secret
from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError
from hutch.runtime.compaction import Compaction
from hutch.runtime.federation.service import FederationService
from hutch.runtime.ports import Clock
from hutch.runtime.queue_types.classic.persistence import Persistence
from hutch.runtime.queue_types.classic.queue_type import ClassicQueueType
from hutch.runtime.queue_types.delayed import DelayedMessages
from hutch.runtime.queue_types.quorum.queue_type import QuorumQueueType
from hutch.runtime.queue_types.quorum.service import QuorumService
from hutch.runtime.queue_types.remote import QueueLink
from hutch.runtime.queue_types.remote_type import RemoteQueueType
from hutch.runtime.queue_types.stream.queue_type import StreamQueueType
from hutch.runtime.queue_types.stream_replication.service import StreamReplicationService
from hutch.runtime.session.protocol import AMQPProtocol
from hutch.runtime.shovel.service import ShovelService, service_for
from hutch.runtime.stream_session.catalog import QueueCatalog
from hutch.runtime.stream_session.handover import is_stream_state
from hutch.runtime.stream_session.hub import StreamHub
from hutch.runtime.stream_session.protocol import StreamProtocol
from hutch.runtime.tls import TlsConfigError
from hutch.runtime.tls_accept import SlotGate, TlsAccept
from hutch.runtime.workers.handover import Locality
from hutch.runtime.workers.link import WorkerLink
from hutch.runtime.workers.spec import node_of_worker, worker_name
from hutch.storage.dirlock import DataDirLock
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
    node.agent = LocalAgent(node)  # what the management API asks of this process (runtime/agent.py)
    # records are offered in this order: a quorum queue's, a queue of another node, then this node's
    node.register_queue_type(QuorumQueueType(node, None, None))
    node.register_queue_type(StreamQueueType(node))  # before classic, which takes any other record
    node.register_queue_type(ClassicQueueType(node, persistence))
    if restore:
        node.restore()
    return node


def cluster_node(node: Node, secret: bytes) -> ClusterService:
    """Make `node` a clustered node: the cluster service, the queue link to other nodes' classic queues
    and the quorum queue service, registered with the transport and as queue types, and the exchange of
    connection and channel counts that makes limits cluster-wide."""
    cluster = ClusterService(node, secret)
    link = QueueLink(node, cluster)
    quorum = QuorumService(node, cluster)
    cluster.add_subsystem(link)
    cluster.add_subsystem(quorum)
    # connection and channel limits count the cluster's (runtime/broker/limits.py)
    gossip = limits.LimitGossip(node, cluster.send, cluster.transport.connected_peers)
    cluster.register(LimitCounts, gossip.received)
    node.cluster_peer_hooks.append(gossip.peer_changed)
    node.limit_hooks.append(gossip.wake)
    cluster.add_subsystem(gossip)
    # Direct Reply-To across nodes and workers: a reply goes to the node its token names
    node.forward_direct_reply = lambda home, token, msg: cluster.send(home, DirectReply(token, msg))
    cluster.register(DirectReply, lambda _peer, r: node.deliver_direct_reply(r.token, r.message))
    node.cluster = cluster
    remote = RemoteQueueType(node, link)
    streams = next(t for t in node.queue_types if isinstance(t, StreamQueueType))
    _replicate_streams(node, cluster, streams)  # (a node of workers: every worker a member, docs/scaling.md)
    # a stream's record goes to the stream type first (a member of a replicated stream opens it), then to
    # the stand-ins of other nodes' queues, then to classic, which takes any other record
    node.queue_types = [QuorumQueueType(node, cluster, quorum), streams, remote,
                        *(t for t in node.queue_types if t.name not in ("quorum", "remote", "stream"))]
    if node.config.worker_index is not None:  # a worker: new queues go to the worker with fewest queues
        for t in node.queue_types:
            if isinstance(t, ClassicQueueType):
                t.elsewhere = remote.place_on_fewest
        streams.elsewhere = remote.place_stream_on_fewest  # (`balanced` streams: the fewest streams' worker)
        _worker_agents(node, cluster)
        _worker_limits(node, cluster)
    return cluster


def _worker_limits(node: Node, cluster: ClusterService) -> None:
    """Exact connection and channel limits between the workers: worker 0 counts for the node
    (runtime/broker/limits.py's `WorkerLimits`)."""
    exact = limits.WorkerLimits(node, node.name, worker_name(node_of_worker(node.name), 0), cluster.call,
                                cluster.transport.connected_peers, (PeerUnavailable, RemoteError, TimeoutError))
    cluster.register(LimitAcquire, exact.on_acquire)
    cluster.register(LimitQuery, exact.on_query)
    node.cluster_peer_hooks.append(exact.peer_changed)
    node.worker_limits = exact


def _replicate_streams(node: Node, cluster: ClusterService, streams: StreamQueueType) -> None:
    """Stream replication on a clustered node (runtime/queue_types/stream_replication/): its service on the
    cluster's transport and Raft driver, the failure detector, and where this node's stream listener is."""
    # replica sessions (incarnation << 32, a u64 on the wire) must grow across the node's restarts: the
    # wall clock's seconds since 2023-11 do (a restart takes longer than a second)
    replication = StreamReplicationService(cluster, streams.fs, node.clock, node.clock.wall_ms() // 1000 - 1_700_000_000)
    node.cluster_peer_hooks.append(replication.peer_changed)
    cfg = node.config

    def endpoint() -> tuple[str, int] | None:
        port = cfg.stream_advertised_port or node.listener_ports.get("stream")
        if not port:
            return None
        return cfg.stream_advertised_host or cfg.cluster_advertise_host or "127.0.0.1", port
    replication.local_endpoint = endpoint
    replication.has_listener = lambda: cfg.stream_port is not None
    replication.unreplicated = streams.unreplicated
    streams.cluster, streams.replication = cluster, replication


def _worker_agents(node: Node, cluster: ClusterService) -> None:
    """A worker answers the other workers' agent queries with its own agent; worker 0, whose management
    listener speaks for the node, asks every worker and answers as the node (runtime/agent_link.py)."""
    own = node.agent
    assert own is not None and node.config.worker_index is not None  # build_node set it; a worker
    serve_agent(cluster, own)
    if node.config.worker_index == 0:
        name = node_of_worker(node.name)
        peers = [worker_name(name, i) for i in range(1, node.config.workers)]
        node.agent = node_agent(name, own, cluster, peers)


async def start_listener(node: Node, handover: Locality | None = None) -> asyncio.base_events.Server:
    """The AMQP listener; `node.amqp_port` is the port it got (config port 0: any free port). `handover`:
    a worker's connection locality (its connections may move to the worker of the queue they use)."""
    loop = asyncio.get_running_loop()
    cfg = node.config
    server = await listen.create_server(loop, amqp_gated(node, handover), cfg.amqp_host, cfg.amqp_port,
                                        backlog=1024, reuse_address=True, **_shared_port(cfg))
    node.server = server
    node.amqp_port = node.listener_ports["amqp"] = server.sockets[0].getsockname()[1]
    log.info("AMQP listener started on %s:%d", listen.display_host(cfg.amqp_host), node.amqp_port)
    return server


def _shared_port(cfg: Config) -> dict[str, bool]:
    """A worker's AMQP and stream protocol listeners share the node's ports with the other workers (the
    kernel spreads the connections over them); a lone node's do not."""
    return {"reuse_port": True} if cfg.worker_index is not None else {}


async def listen_own_port(node: Node, make_protocol: Callable[[], asyncio.Protocol], host: str,
                          name: str) -> asyncio.base_events.Server | None:
    """`workers.own_ports`: a worker's listener of its own beside a shared one (port 0; `<name>_w<N>` in
    the ports file: `amqp`, `amqps`, `stream`, `stream_tls`), so that a client (a test, an operator) can
    pick the worker it talks to. None when the worker has no own ports (or this is no worker)."""
    cfg = node.config
    if cfg.worker_index is None or not cfg.worker_own_ports:
        return None
    server = await listen.create_server(asyncio.get_running_loop(), make_protocol, host, 0,
                                        backlog=1024, reuse_address=True)
    node.listener_ports[f"{name}_w{cfg.worker_index}"] = server.sockets[0].getsockname()[1]
    return server


async def start_own_listener(node: Node, handover: Locality | None = None) -> asyncio.base_events.Server | None:
    """`workers.own_ports`: a worker's AMQP listener of its own (`amqp_w<N>`, `listen_own_port`)."""
    return await listen_own_port(node, amqp_gated(node, handover), node.config.amqp_host, "amqp")


def amqp_gated(node: Node, handover: Locality | None) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of a plain AMQP listener: a connection holds a slot of the listener's own
    `HandshakeGate` (a share of the descriptors, a quarter of that per source) from the accept until its
    login succeeds; past a cap it is closed at the accept."""
    gate = listen.HandshakeGate(listen.handshake_slots(), "AMQP", "before login")
    return lambda: AMQPProtocol(node, handover, gate=gate)


def stream_gated(hub: StreamHub) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of a plain stream-protocol listener, gated until login as `amqp_gated`."""
    gate = listen.HandshakeGate(listen.handshake_slots(), "stream protocol", "before login")
    return lambda: StreamProtocol(hub, gate=gate)


def tls_gated(node: Node, make_protocol: Callable[[], asyncio.Protocol], what: str) -> Callable[[], asyncio.Protocol]:
    """The protocol factory of a TLS listener (`ssl_options.*`) whose protocol knows nothing of TLS: TLS
    starts after the accept (runtime/tls_accept.py), so a connection counts from its first byte; its
    handshake is bounded by `ssl_handshake_timeout`, and the connections in it by the listener's own
    `HandshakeGate` (a share of the descriptors, a quarter of that per source). `what` names the listener in logs."""
    gate = listen.HandshakeGate(listen.handshake_slots(), what, "in their TLS handshake")
    timeout_s = node.config.ssl_handshake_timeout_ms / 1000
    return lambda: TlsAccept(SlotGate(make_protocol, gate), node.tls.current("ssl_options"), timeout_s)


async def start_tls_listener(node: Node, handover: Locality | None = None) -> asyncio.base_events.Server | None:
    """The AMQP-over-TLS listener (`listeners.ssl.default`, `ssl_options.*`) when configured: the same
    protocol behind TLS, which starts after the accept (runtime/tls_accept.py): the handshake is bounded by
    `ssl_handshake_timeout` and the connections in it by `HandshakeSlots`. Sets `node.amqps_port`.
    `handover`: a worker's connection locality (a TLS connection moves relayed: runtime/workers/relay.py).
    Raises TlsConfigError (a certificate that cannot be loaded) or OSError."""
    cfg = node.config
    if cfg.amqps_port is None:
        return None
    ctx = node.tls.server_context("ssl_options")
    assert ctx is not None  # the config requires ssl_options.certfile with listeners.ssl.default;
    # each accept takes the live context (`current`): a certificate reload swaps it
    loop = asyncio.get_running_loop()
    server = await listen.create_server(loop, tls_gated(node, lambda: AMQPProtocol(node, handover), "AMQP over TLS"),
                                        cfg.amqps_host, cfg.amqps_port, backlog=1024, reuse_address=True,
                                        **_shared_port(cfg))
    node.amqps_port = node.listener_ports["amqps"] = server.sockets[0].getsockname()[1]
    log.info("AMQP over TLS listener started on %s:%d", listen.display_host(cfg.amqps_host), node.amqps_port)
    return server


async def start_own_tls_listener(node: Node, handover: Locality | None = None) -> asyncio.base_events.Server | None:
    """`workers.own_ports` with AMQP over TLS: a worker's TLS listener of its own (`amqps_w<N>`,
    `listen_own_port`), when the node listens for AMQP over TLS."""
    cfg = node.config
    if cfg.amqps_port is None:
        return None
    return await listen_own_port(node, tls_gated(node, lambda: AMQPProtocol(node, handover), "AMQP over TLS"),
                                 cfg.amqps_host, "amqps")


async def start_streams(node: Node, handover: Locality | None = None) -> Callable[[], Awaitable[None]] | None:
    """The stream protocol's listeners (`stream.listeners.tcp.default`, `stream.listeners.ssl.default`
    with `ssl_options.*`) and the streams they serve, when a port is configured; returns what stops them.
    Raises OSError (with `hutch_listener` naming the listener) or TlsConfigError."""
    cfg = node.config
    if cfg.stream_port is None and cfg.stream_tls_port is None:
        return None
    replication = next((t.replication for t in node.queue_types if isinstance(t, StreamQueueType)), None)
    hub = StreamHub(node, QueueCatalog(node, replication))  # (a clustered node: streams of other nodes too)
    hub.handover = handover  # a worker's stream connections move to their stream's home (workers.locality)
    node.streams = hub  # what management lists (mgmt/stream_routes.py)
    if isinstance(node.cluster, ClusterService):  # single-active-consumer groups across the members
        hub.sac_router.start(node.cluster)
        node.cluster_peer_hooks.append(hub.sac_router.peer_changed)
        hub.reader_link.start(node.cluster)  # a stream's one copy in a node of workers, from the others
        node.cluster_peer_hooks.append(hub.reader_link.peer_changed)
    loop = asyncio.get_running_loop()
    servers: list[asyncio.base_events.Server] = []

    async def stop() -> None:
        for server in servers:
            server.close()
        for conn in list(hub.connections):
            conn.close_forced("broker forced connection closure")
        hub.sac_router.stop()
        node.streams = None

    try:
        if cfg.stream_port is not None:
            plain_protocol = stream_gated(hub)  # (one gate for the shared port and a worker's own)
            server = await listen.create_server(loop, plain_protocol, cfg.stream_host,
                                                cfg.stream_port, backlog=1024, reuse_address=True,
                                                **_shared_port(cfg))
            servers.append(server)
            hub.port = node.listener_ports["stream"] = server.sockets[0].getsockname()[1]
            log.info("stream protocol listener started on %s:%d", listen.display_host(cfg.stream_host), hub.port)
            own = await listen_own_port(node, plain_protocol, cfg.stream_host, "stream")
            if own is not None:
                servers.append(own)
                hub.own_port = own.sockets[0].getsockname()[1]
        if cfg.stream_tls_port is not None:
            ctx = node.tls.server_context("ssl_options")
            assert ctx is not None  # the config requires ssl_options.certfile with stream.listeners.ssl.default
            tls_protocol = tls_gated(node, lambda: StreamProtocol(hub, tls=True), "stream protocol over TLS")
            server = await listen.create_server(loop, tls_protocol, cfg.stream_tls_host, cfg.stream_tls_port,
                                                backlog=1024, reuse_address=True, **_shared_port(cfg))
            servers.append(server)
            hub.tls_port = node.listener_ports["stream_tls"] = server.sockets[0].getsockname()[1]
            log.info("stream protocol over TLS listener started on %s:%d",
                     listen.display_host(cfg.stream_tls_host), hub.tls_port)
            own = await listen_own_port(node, tls_protocol, cfg.stream_tls_host, "stream_tls")
            if own is not None:
                servers.append(own)
                hub.own_tls_port = own.sockets[0].getsockname()[1]
    except OSError as exc:
        await stop()
        exc.hutch_listener = f"the stream protocol on port {cfg.stream_port if not servers else cfg.stream_tls_port}"  # type: ignore[attr-defined]  # read by serve's one-line error
        raise
    except TlsConfigError:
        await stop()
        raise
    return stop


def _cluster_tls(node: Node, cluster: ClusterService) -> None:
    """TLS between nodes (`cluster.ssl.*`) for the cluster's transport; TlsConfigError if unloadable."""
    contexts = node.tls.cluster_contexts()
    if contexts is not None:
        cluster.transport.ssl_server, cluster.transport.ssl_client = contexts

        def reloaded() -> None:  # a certificate reload swaps in new contexts (runtime/tls.py)
            fresh = node.tls.cluster_contexts()
            assert fresh is not None
            cluster.transport.ssl_server, cluster.transport.ssl_client = fresh

        node.tls.on_reload(reloaded)


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
                prepare: Callable[[Node], str | None] | None = None, worker: WorkerLink | None = None) -> int:
    """Run a node. `prepare` runs after recovery and before the listeners accept clients (the CLI
    passes the management layer's definitions import for `load_definitions`); a returned text is a
    one-line start-up error. The data directory is locked first, for the node's whole life
    (storage/dirlock.py): a second node on it is refused in one line naming the holder's pid."""
    lock: DataDirLock | None = None
    if config.data_dir:
        taken = DataDirLock.acquire_or_reason(config.data_dir)
        if isinstance(taken, str):
            print(f"hutch-server: {taken}", file=sys.stderr)
            return 1
        lock = taken
    try:
        return await _serve_locked(config, services, prepare, worker)
    finally:
        if worker is not None:
            worker.stop()
        if lock is not None:
            lock.release()


def _locality(node: Node, cluster: ClusterService | None, worker: WorkerLink | None) -> Locality | None:
    """A worker's connection locality (`workers.locality`, runtime/workers/handover.py): its AMQP
    connections (TLS ones relayed: runtime/workers/relay.py) move to the worker of the queue they first use, its stream connections to the
    home of the stream they first publish to or read, and it adopts those others hand to it."""
    cfg = node.config
    if worker is None or cluster is None or cfg.worker_index is None or not cfg.worker_locality:
        return None
    loop = asyncio.get_running_loop()
    transport = cluster.transport

    async def adopt(sock: socket.socket, state: bytes) -> None:
        if is_stream_state(state):  # a stream-protocol connection (its stream's home is this worker)
            hub = node.streams
            if not isinstance(hub, StreamHub):  # (the stream listeners stopped meanwhile)
                sock.close()
                return
            await loop.connect_accepted_socket(lambda: StreamProtocol(hub, adopted=state), sock=sock)
            return
        await loop.connect_accepted_socket(lambda: AMQPProtocol(node, locality, adopted=state), sock=sock)
    locality = Locality(worker, node.name, cfg.worker_index, transport.connected, adopt)
    return locality


def _compaction(node: Node, cluster: ClusterService | None, worker: WorkerLink | None,
                locality: Locality | None) -> Compaction | None:
    """A worker's compaction of load (`workers.compaction`, runtime/compaction.py): its reports, worker 0's
    controller, and the moves of islands (queues with their connections) between workers."""
    if worker is None or cluster is None or not node.config.compaction_on:
        return None
    remote = next(t for t in node.queue_types if isinstance(t, RemoteQueueType))
    classic = next(t for t in node.queue_types if isinstance(t, ClassicQueueType))
    return Compaction(node, cluster, remote.link, remote, classic, worker, locality)


async def _serve_locked(config: Config, services: Sequence[Service],
                        prepare: Callable[[Node], str | None] | None, worker: WorkerLink | None) -> int:
    # a stray SIGHUP while the node starts must not kill it; NodeTls.start takes the signal over later
    with contextlib.suppress(RuntimeError, ValueError, NotImplementedError):  # not the main thread
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGHUP, lambda: log.info("SIGHUP received while the node starts: ignored"))
    stop = asyncio.Event()
    if worker is not None:  # heartbeats from the start; the supervisor's end of file stops this worker
        worker.start(stop.set)
    clustered = config.cluster_enabled  # a cluster of one unless turned off (docs/clustering.md)
    if config.data_dir:
        portfile.remove(config.data_dir)  # a previous process's ports never answer for this one
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
        if cluster is not None and worker is not None:  # the worker link: the supervisor's socket pairs
            for peer, sock in worker.first_links().items():
                cluster.transport.adopt(peer, sock)
            worker.set_adopt(cluster.transport.adopt)
            cluster.rejoin = worker.request_rejoin  # hutchctl join_cluster: the supervisor restarts the workers
        if worker is not None:  # memory and disk alarms are node-wide: reported to, and told by, the supervisor
            node.alarm_hooks.append(worker.report_alarms)
            worker.on_node_alarms(node.set_worker_alarms)
        locality = _locality(node, cluster, worker)
        compaction = _compaction(node, cluster, worker, locality)
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
        if cluster.transport.network:  # (a node of workers alone: its workers' link only, no port)
            node.listener_ports["cluster"] = cluster.transport.port
        node.recover_messages()
        if compaction is not None:
            compaction.recover()  # a queue promised to another worker before a restart is not served here
    if prepare is not None:
        problem = prepare(node)
        if problem:
            print(f"hutch-server: {problem}", file=sys.stderr)
            return 1
    try:
        server = await start_listener(node, locality)
    except OSError as exc:
        print(f"hutch-server: cannot listen for AMQP on port {config.amqp_port}: {_listen_error(exc)}",
              file=sys.stderr)
        return 1
    try:
        tls_server = await start_tls_listener(node, locality)
    except (OSError, TlsConfigError) as exc:
        text = str(exc) if isinstance(exc, TlsConfigError) else _listen_error(exc)
        print(f"hutch-server: cannot listen for AMQP over TLS on port {config.amqps_port}: {text}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    try:
        own_server = await start_own_listener(node, locality)
        own_tls_server = await start_own_tls_listener(node, locality)
    except OSError as exc:
        print(f"hutch-server: cannot listen for AMQP on a worker's own port: {_listen_error(exc)}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    await node.start()
    stoppers: list[Callable[[], Awaitable[None]]] = [await start_shovels(node, cluster)]
    if tls_server is not None:
        stoppers.append(_closer(tls_server))
    for own in (own_server, own_tls_server):
        if own is not None:
            stoppers.append(_closer(own))
    try:
        streams = await start_streams(node, locality)
    except TlsConfigError as exc:
        print(f"hutch-server: cannot listen for the stream protocol over TLS on port {config.stream_tls_port}: "
              f"{exc}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    except OSError as exc:
        print(f"hutch-server: cannot listen for {getattr(exc, 'hutch_listener', 'the stream protocol')}: "
              f"{_listen_error(exc)}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    if streams is not None:
        stoppers.append(streams)
    try:
        for service in services:
            stoppers.append(await service(node))
    except OSError as exc:
        what = getattr(exc, "hutch_listener", None)
        print(f"hutch-server: cannot listen for {what}: {_listen_error(exc)}" if what
              else f"hutch-server: cannot start: {_listen_error(exc)}", file=sys.stderr)
        await stop_node(node, server)
        return 1
    loop = asyncio.get_running_loop()
    # a worker leaves SIGINT (a terminal's ^C reaches the whole process group) to its supervisor
    for sig in (signal.SIGTERM,) if worker is not None else (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    node.tls.start()  # certificate reloads (SIGHUP, file changes) for every TLS listener
    if compaction is not None:
        compaction.start()
        loop.add_signal_handler(signal.SIGUSR1, compaction.force)  # the test hook: move an island now
    _announce_ports(node)
    if worker is not None:
        worker.ready(node.listener_ports)
    log.info("node %s started (hutch %s)", node.name, __version__)
    await stop.wait()
    node.tls.stop()
    log.info("node %s stopping", node.name)
    for stopper in reversed(stoppers):
        await stopper()
    if compaction is not None:
        compaction.stop()
    await stop_node(node, server)
    if locality is not None:
        locality.stop()  # the relays of TLS connections served by other workers end with this worker
    if cluster is not None:
        await cluster.stop()
    if config.data_dir:
        portfile.remove(config.data_dir)
    log.info("node %s stopped", node.name)
    return 0


def _announce_ports(node: Node) -> None:
    """The bound port of every listener, in the log and in the ports file (portfile.py): what a harness
    that started the node with port 0 reads."""
    ports = node.listener_ports
    where = ""
    if node.config.data_dir:
        try:
            where = f" (written to {portfile.write(node.config.data_dir, node.name, os.getpid(), ports)})"
        except OSError as exc:
            where = f" (no ports file: {exc})"
    log.info("listening: %s%s", ", ".join(f"{name} {port}" for name, port in ports.items()), where)


async def start_shovels(node: Node, cluster: ClusterService | None) -> Callable[[], Awaitable[None]]:
    """The dynamic shovels (runtime/shovel/) and federation links (runtime/federation/): on a clustered
    node they run where the metadata leader is."""
    shovels: ShovelService = service_for(node)
    federation = FederationService(node, node.parameters)
    if cluster is not None:
        shovels.runs_here = federation.runs_here = lambda: cluster.is_leader
        cluster.leader_hooks.append(lambda _leads: shovels.placement_changed())
        cluster.leader_hooks.append(lambda _leads: federation.placement_changed())
    node.shovels, node.federation = shovels, federation
    await shovels.start()
    await federation.start()

    async def stop() -> None:
        await federation.stop()
        await shovels.stop()

    return stop


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
             prepare: Callable[[Node], str | None] | None = None, worker: WorkerLink | None = None) -> int:
    """Run a node until SIGTERM/SIGINT; returns the process exit code. Sets the process umask to
    DATA_UMASK first: data at rest (bodies, password hashes) is readable by the node's user only."""
    os.umask(DATA_UMASK)
    tune_gc()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; keep the node usable without it
        return asyncio.run(serve(config, services, prepare, worker))
    return uvloop.run(serve(config, services, prepare, worker))


__all__ = ["Service", "build_node", "cluster_node", "run_node", "serve", "start_node", "stop_node"]
