"""The cluster service of a node: inter-node transport, the Raft driver, the metadata group, joining.

Owns: the node's cluster identity (`<data_dir>/cluster/node.json`: name and raft id), the shared
secret, starting the transport and the Raft driver, the metadata Raft group (cluster/metadata.py), the
boot sequence of a clustered node, proposals of metadata changes (batched per loop iteration and
forwarded to the leader), read barriers, joining and forgetting nodes, and the node's end of the inter-node
messages: `send`/`call` of records (`hutch.cluster.messages`, one codec) and the dispatch table other
subsystems register their handlers in (`register`).

Rules:
- Boot: open the metadata group from disk (or bootstrap a new one-node cluster, or join one through a
  seed node), then wait for a read barrier (a no-op committed and applied here), so this node's
  definitions are as new as the cluster's before it recovers messages and accepts clients.
- A metadata change is made on the node that received it after a barrier, then proposed; the client
  gets its reply once the proposal is committed (docs/clustering.md, "Consistency").
- With no majority, barriers and proposals time out after `cluster_metadata_timeout_ms`; callers turn
  that into RabbitMQ's error: "... because the operation timed out" (541 INTERNAL_ERROR).
- Every message between nodes is a record of `hutch.cluster.messages`, encoded once by its codec; Raft
  batches are `RaftMessage` (decoded on a fast path), everything else goes through the registry. A message
  that is unknown or malformed is logged and dropped (a request gets an error reply); it never closes the
  connection or stops the others in its batch.
- A worker of a node with worker processes (runtime/workers/) is a member of the node's internal
  cluster (`config.worker_index` is set): its transport is paired (the socket pairs the supervisor
  made, adopted by the worker's control link; no listener, no handshake) and its peers are the node's
  other workers; everything above holds unchanged. A node of workers set up for a multi-node cluster
  (`--join`, or an inter-node port given: `cluster_port_set` in the worker's Config) is both: every
  worker of every node is a member, its own node's workers over the worker link and the others over the
  network (docs/scaling.md, "A node of workers in a multi-node cluster"; runtime/workers/membership.py).
  Placement picks members on distinct nodes, and the status names nodes, never workers.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Awaitable, Callable
from typing import Any, overload

from hutch.cluster import messages as cm
from hutch.cluster.metadata import METADATA_GROUP, Member, MetadataMachine, encode_ops
from hutch.config import Config
from hutch.core import definition_ops as ops_
from hutch.core.definition_ops import DefinitionOp
from hutch.runtime.clustering.raft_driver import NotLeader, ProposalTimeout, RaftDriver
from hutch.runtime.clustering.raft_group import Group
from hutch.runtime.clustering.transport import (
    HEARTBEAT_S,
    PEER_TIMEOUT_S,
    WORKER_LINK_HEARTBEAT_S,
    WORKER_LINK_TIMEOUT_S,
    PeerUnavailable,
    RemoteError,
    Transport,
)
from hutch.runtime.errors import ClusterUnavailable
from hutch.runtime.ports import ClusterNodePort, ClusterSubsystem
from hutch.runtime.workers import membership
from hutch.runtime.workers.spec import node_of_worker
from hutch.storage.raft_log import RaftLogOptions

log = logging.getLogger("hutch.cluster")

IDENTITY_FILE = "node.json"
LISTEN_PORT_FILE = "listen_port"  # a worker's own inter-node port, listened on again after a restart
SECRET_FILE = ".hutch.secret"
RETRY_S = 0.05


def parse_seed(text: str, local_name: str = "") -> tuple[str, str, int]:
    """'n1@db1@10.0.0.5:25672' -> ('n1@db1', '10.0.0.5', 25672). A short node name ('n1@127.0.0.1:25672')
    takes the host part of `local_name`, as node names do (config: 'n1' is 'n1@<this host>').
    ValueError with a one-line reason."""
    name, sep, address = text.rpartition("@")
    host, colon, port = address.rpartition(":")
    if not sep or not name or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected NODE@HOST:PORT (e.g. n1@127.0.0.1:25672), got {text!r}")
    if "@" not in name and "@" in local_name:
        name = f"{name}@{local_name.split('@', 1)[1]}"
    return name, host.strip("[]"), int(port)


def load_secret(config: Config) -> bytes:
    """The shared secret: config `cluster_secret` (or env HUTCH_CLUSTER_SECRET), else the file
    `cluster_secret_file`, else `<data_dir>/.hutch.secret`, created (mode 0600) on first use. A
    file group or others may read is refused unless allowed (`_check_secret_mode`)."""
    if config.cluster_secret:
        return config.cluster_secret.encode()
    path = config.cluster_secret_file or os.path.join(config.data_dir, SECRET_FILE)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32))
        log.info("created cluster secret file %s (copy it to every node of the cluster)", path)
    _check_secret_mode(path, getattr(config, "cluster_secret_file_insecure_ok", False))
    with open(path) as f:
        secret = f.read().strip()
    if not secret:
        raise ValueError(f"cluster secret file {path} is empty")
    return secret.encode()


def _check_secret_mode(path: str, insecure_ok: bool) -> None:
    """A secret file that group or others may read is refused (ValueError, one line), unless the
    operator allowed it (`--allow-insecure-secret-file`, `cluster.secret_file_insecure_ok`): then
    a warning. Whoever reads the secret can join the cluster and read every replicated message."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if not mode & 0o077:
        return
    if not insecure_ok:
        raise ValueError(f"cluster secret file {path} is accessible by group or others (mode {mode:04o}); "
                         f"run chmod 600 {path}, or start with --allow-insecure-secret-file")
    log.warning("cluster secret file %s is accessible by group or others (mode %04o); allowed by "
                "cluster.secret_file_insecure_ok", path, mode)


class ClusterService:
    def __init__(self, node: ClusterNodePort, secret: bytes) -> None:
        cfg = node.config
        self.node = node
        self.name = node.name
        self.config = cfg
        self.directory = os.path.join(cfg.data_dir, "cluster")
        self.incarnation = secrets.token_hex(8)
        self.machine = MetadataMachine(node, self.incarnation)
        self.machine.on_applied = self._applied
        self.timeout_s = cfg.cluster_metadata_timeout_ms / 1000
        self.advertise_host = cfg.cluster_advertise_host or "127.0.0.1"
        assert cfg.cluster_port is not None  # Invariant: app.py clusters a node only with a cluster port
        # the worker link alone (a node of workers not set up for a multi-node cluster) beats slower
        # than a network link: see WORKER_LINK_HEARTBEAT_S
        link_only = cfg.worker_index is not None and not cfg.cluster_port_set
        self.transport = Transport(self.name, secret, cfg.cluster_host, cfg.cluster_port,
                                   on_message=self._on_message, on_request=self._on_request,
                                   on_peer_up=self._on_peer_up, on_peer_down=self._on_peer_down,
                                   heartbeat_s=WORKER_LINK_HEARTBEAT_S if link_only else HEARTBEAT_S,
                                   peer_timeout_s=WORKER_LINK_TIMEOUT_S if link_only else PEER_TIMEOUT_S,
                                   paired=cfg.worker_index is not None,
                                   # a worker of a node set up for a multi-node cluster: the network too
                                   network=cfg.worker_index is None or cfg.cluster_port_set,
                                   is_sibling=self.is_sibling, answers_as=membership.seed_answers)
        self.transport.load = node.loop_load  # inter-node input is loop work for the flow rule
        self.raft_id = 0
        self.driver: RaftDriver | None = None
        self.group: Group | None = None  # the metadata Raft group, open once `start` has opened the driver
        self.leader_hooks: list[Callable[[bool], None]] = []  # told (this node leads?) when the leader changes
        self.peers: dict[str, Member] = {}  # every other member we know of, by name
        self._pending_ops: list[DefinitionOp] = []
        self._flush_handle: asyncio.Handle | None = None
        self._inflight: list[asyncio.Future[None]] = []  # proposals not yet committed, oldest first
        self._apply_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._join_lock = asyncio.Lock()
        # peer -> what writes records held back for it (the queue link's batches of one loop turn): run
        # before any other record to that peer is queued, so the order per peer is the order of the calls
        self.held: dict[str, Callable[[str], None]] = {}
        self.registry = cm.Registry()  # the handlers of inter-node messages and requests, by record kind
        self.register(cm.Join, self._handle_join)
        self.register(cm.Propose, self._handle_propose)
        self.register(cm.Leave, self._handle_leave)
        self.register(cm.Status, self._handle_status)
        self.register(cm.Sync, self._handle_sync)
        self.register(cm.BlockPeers, self._handle_block)
        # parts of the node that speak over the transport (the queue types' services: the link to classic
        # queues on other nodes, the quorum queue service), registered by runtime/app.py; this service only
        # tells them when the boot is done and stops them (the management API finds the quorum service
        # here by its type: mgmt/quorum.py)
        self.subsystems: list[ClusterSubsystem] = []
        # awaited after this node's changes commit, before the client's reply (e.g. a new quorum
        # queue's first election): zero-argument callables returning awaitables (of anything: ignored)
        self.post_commit: list[Callable[[], Awaitable[Any]]] = []
        # a worker of a node of workers: asks the supervisor to restart every worker joining a cluster
        # (`join_as_node_of_workers`; runtime/workers/link.py `request_rejoin`, set by runtime/app.py)
        self.rejoin: Callable[[str], bool] | None = None

    def add_subsystem(self, subsystem: ClusterSubsystem) -> None:
        """A part of the node that speaks over the transport (it registers its message handlers with
        `register`): told when the boot is done, and stopped with the service."""
        self.subsystems.append(subsystem)

    # -- identity ----------------------------------------------------------------------------------------
    def _identity_path(self) -> str:
        return os.path.join(self.directory, IDENTITY_FILE)

    def _load_identity(self) -> int:
        path = self._identity_path()
        if not os.path.exists(path):
            return 0
        with open(path) as f:
            doc = json.load(f)
        if doc["name"] != self.name:
            raise ValueError(f"data directory belongs to cluster node {doc['name']!r}, not {self.name!r}")
        return int(doc["raft_id"])

    def _save_identity(self, raft_id: int) -> None:
        os.makedirs(self.directory, exist_ok=True)
        tmp = self._identity_path() + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"name": self.name, "raft_id": raft_id}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._identity_path())
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @property
    def is_new(self) -> bool:
        return not os.path.exists(self._identity_path())

    def _log_options(self) -> RaftLogOptions:
        return RaftLogOptions(wal_max_size_bytes=self.config.raft_wal_max_size_bytes,
                              segment_max_entries=self.config.raft_segment_max_entries)

    # -- boot ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self._start_transport()
        raft_id = self._load_identity()
        seed = self.config.cluster_join
        joined: cm.JoinReply | None = None
        if raft_id == 0 and seed:
            joined = await self._join_through(seed)
            raft_id = joined.raft_id
        elif raft_id == 0:
            raft_id = 1
        self.raft_id = raft_id
        self.driver = RaftDriver(raft_id, os.path.join(self.directory, "raft"), self._send_raft,
                                 tick_s=self.config.cluster_tick_ms / 1000,
                                 log_options=self._log_options(), load=self.node.loop_load)
        await self.driver.start()
        bootstrap = raft_id == 1 and joined is None and METADATA_GROUP not in self.driver.groups_on_disk()
        self.group = self.driver.open_group(METADATA_GROUP, self.machine,
                                            bootstrap_voters=[1] if bootstrap else None)
        self.group.on_leader_change = self._leader_changed
        if joined is not None:
            self._save_identity(raft_id)
            for v in joined.members:
                self._learn(Member.from_list(v))
        if seed and not bootstrap and raft_id not in self.machine.voters:
            # ready to take the leader's log: now become a voter (a restart between the two steps of a
            # join comes here again; both steps are idempotent)
            await self._join_through(seed, promote=True)
        if bootstrap:
            self._save_identity(raft_id)
            self.group.campaign()
            # the founding entry: this node as the first member, and the definitions it starts with
            ops: list[DefinitionOp] = [ops_.ClusterJoin(self.name, self.advertise_host, self.transport.port, 1)]
            ops += self.node.state_ops()
            await self._propose_until_done(ops)
            log.info("cluster %s founded by %s (cluster port %d)", self.config.cluster_name, self.name,
                     self.transport.port)
        elif len(self.machine.voters) == 1 and self.machine.voters[0] == raft_id:
            self.group.campaign()
        await self._boot_barrier()
        await self._refresh_address()
        for sub in self.subsystems:
            sub.booted()
        if self.node.stale_transient:  # this node's transient queues did not survive its restart
            for vhost, name in self.node.stale_transient:
                self.replicate(ops_.DeleteQueue(vhost, name))
            log.info("removing %d transient queues of this node's previous run from the cluster",
                     len(self.node.stale_transient))
            self.node.stale_transient.clear()
            await self.wait_replicated()

    async def _start_transport(self) -> None:
        """Start the transport. A worker that listens for other nodes on a port of its own (port 0: a
        node of workers' workers but the first, or a node started on port 0) listens on the port it had
        before when it can (`cluster/listen_port`): the other members know it there, and a worker that came
        back elsewhere could only be found through the metadata leader (a re-registered address), which
        itself may be a worker no one else can reach yet after every node restarted."""
        remember = self.config.worker_index is not None and self.transport.network and not self.config.cluster_port
        path = os.path.join(self.directory, LISTEN_PORT_FILE)
        if remember:
            try:
                with open(path) as f:
                    self.transport.port = int(f.read().strip())
            except (OSError, ValueError):
                pass
        try:
            await self.transport.start()
        except OSError as exc:
            if not remember or not self.transport.port:
                raise
            log.info("cannot listen on port %d again (%s): on a new one", self.transport.port, exc)
            self.transport.port = 0
            await self.transport.start()
        if remember:
            os.makedirs(self.directory, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                f.write(str(self.transport.port))
            os.replace(path + ".tmp", path)

    async def _boot_barrier(self) -> None:
        waited = 0.0
        while True:
            try:
                await self.barrier(timeout=5.0)
                return
            except ClusterUnavailable:
                waited += 5.0
                log.warning("waiting for a majority of the cluster's metadata members (%d of %d reachable) "
                            "for %.0f s", 1 + len(self.transport.connected_peers()),
                            max(1, len(self.machine.voters)), waited)

    async def stop(self) -> None:
        for sub in self.subsystems:
            sub.stop()
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        if self.driver is not None:
            await self.driver.stop()
        await self.transport.stop()

    async def _join_through(self, seed: str, promote: bool = False) -> cm.JoinReply:
        """Join in two steps: register (the leader records this node and gives it a raft id), then,
        once this node's Raft group is open to receive the log, promote (the leader adds it as a voter;
        the change commits only with this node's acknowledgement, so it must be listening first)."""
        name, host, port = parse_seed(seed, self.name)
        if name == self.name:
            raise ValueError(f"cannot join through {seed}: that is this node's own name")
        self.transport.set_peer(name, host, port)
        request = cm.Join(self.name, self.advertise_host, self.transport.port, promote)
        deadline = asyncio.get_running_loop().time() + max(30.0, self.timeout_s)
        name = await self._seed_member(seed, name, host, port, deadline)
        while True:
            try:
                reply = await self.call(name, request, timeout=self.timeout_s)
                if promote:
                    log.info("joined the cluster through %s as raft member %d", seed, reply.raft_id)
                return reply
            except (TimeoutError, PeerUnavailable, RemoteError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise ValueError(f"cannot join the cluster through {seed}: {exc or type(exc).__name__}") \
                        from None
                await asyncio.sleep(0.5)

    async def _seed_member(self, seed: str, name: str, host: str, port: int, deadline: float) -> str:
        """The member name the seed answers as: its own, or (a node of workers) its worker 0's
        (`n1@host#w0`, which listens on the node's inter-node port). The seed is then known by that name
        only, so that the dialled connection is not kept twice under two names."""
        while True:
            try:
                status = await self.call(name, cm.Status(), timeout=self.timeout_s)
                break
            except (TimeoutError, PeerUnavailable, RemoteError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise ValueError(f"cannot join the cluster through {seed}: {exc or type(exc).__name__}") \
                        from None
                await asyncio.sleep(0.5)
        if status.name == name or not membership.seed_answers(name, status.name):
            return name
        log.info("seed %s answers as %s", seed, status.name)
        self.transport.remove_peer(name)
        self.transport.set_peer(status.name, host, port)
        return status.name

    # -- members and the transport --------------------------------------------------------------------------
    def is_sibling(self, name: str) -> bool:
        """Whether `name` is another worker of this node (reached over the worker link, never the network)."""
        return self.config.worker_index is not None and name != self.name and membership.same_node(name, self.name)

    def siblings(self) -> list[str]:
        """The other workers of this node that are connected (none for a one-process node)."""
        if self.config.worker_index is None:
            return []
        return membership.siblings(self.name, self.transport.connected_peers())

    async def _refresh_address(self) -> None:
        """A member whose inter-node address changed since it registered (a worker listens on a port of
        its own, port 0, which a restart changes) records the new one, so that nodes which did not hear
        from it yet dial it there (a `ClusterJoin` of a member keeps its raft id)."""
        me = self.machine.members.get(self.name)
        if me is None or not self.transport.network or (me.host, me.port) == (self.advertise_host, self.transport.port):
            return
        log.info("inter-node address of %s is now %s:%d (was %s:%d)", self.name, self.advertise_host,
                 self.transport.port, me.host, me.port)
        await self._propose_until_done([ops_.ClusterJoin(self.name, self.advertise_host, self.transport.port)],
                                       timeout=None)

    def _learn(self, m: Member) -> None:
        if m.name == self.name:
            return
        old = self.peers.get(m.name)
        self.peers[m.name] = m
        if old is None or (old.host, old.port) != (m.host, m.port):
            self.transport.set_peer(m.name, m.host, m.port)

    def members_changed(self) -> None:
        """The member table or the voters changed (called by the node for the metadata machine)."""
        for m in self.machine.members.values():
            self._learn(m)
        for name in [n for n in self.peers if n not in self.machine.members and not self.is_sibling(n)]:
            # (a worker of this node keeps its worker link: it comes from the supervisor, not the table)
            if self.machine.members:  # a snapshot not yet applied must not drop what the join told us
                del self.peers[name]
                self.transport.remove_peer(name)

    def _name_of(self, raft_id: int) -> str | None:
        for m in self.peers.values():
            if m.raft_id == raft_id:
                return m.name
        return None

    def _raft_id_of(self, name: str) -> int:
        m = self.peers.get(name) or self.machine.members.get(name)
        return m.raft_id if m is not None else 0

    def _send_raft(self, raft_id: int, payload: list[Any]) -> None:  # Any: a PeerBatch's msgpack values
        name = self._name_of(raft_id)
        if name is not None:
            if self.held:
                self.release(name)
            self.transport.send_packed(name, cm.encode(cm.RaftMessage(payload)))

    # -- inter-node messages ---------------------------------------------------------------------------------
    def register(self, kind: type[cm.R], handler: Callable[[str, cm.R], Any]) -> None:
        """Handle inter-node messages (or requests) of record `kind` with `handler(peer, record)`; a request's
        handler returns the reply (a record, a plain value, or an awaitable of either: open by kind, so Any)."""
        self.registry.register(kind, handler)

    def connected(self, peer: str) -> bool:
        return self.transport.connected(peer)

    def send(self, peer: str, record: cm.Record) -> bool:
        """Queue a message record for `peer`; False (dropped) when it is not connected or its buffers are full."""
        if self.held:
            self.release(peer)
        return self.transport.send_packed(peer, cm.encode(record))

    def hold(self, peer: str, release: Callable[[str], None]) -> None:
        """Records for `peer` are held back by the caller until `release(peer)` writes them (it is called
        before any other record to `peer` is queued, and by the caller at the end of its loop turn)."""
        self.held[peer] = release

    def release(self, peer: str) -> None:
        """Write what is held back for `peer` (see `hold`), if anything."""
        release = self.held.pop(peer, None)
        if release is not None:
            release(peer)

    # A request answered by a record gets that record's type; one answered by a plain msgpack value (an int,
    # a bool, a JSON-able dict: named in each request's docstring) gets Any, as that value is not checked
    # when it arrives: the caller converts it (`int(...)`) or reads it as the JSON it is.
    @overload
    async def call(self, peer: str, request: cm.Join, timeout: float = 5.0) -> cm.JoinReply: ...

    @overload
    async def call(self, peer: str, request: cm.Status, timeout: float = 5.0) -> cm.NodeStatus: ...

    @overload
    async def call(self, peer: str, request: cm.QueueGet, timeout: float = 5.0) -> cm.QueueGetReply: ...

    @overload
    async def call(self, peer: str, request: cm.QuorumGet, timeout: float = 5.0) -> cm.QuorumGetReply: ...

    @overload
    async def call(self, peer: str, request: cm.Request, timeout: float = 5.0) -> Any: ...

    async def call(self, peer: str, request: cm.Request, timeout: float = 5.0) -> Any:
        """Send a request record and await its reply (the request's `REPLY` record, or a plain value)."""
        if self.held:
            self.release(peer)
        value = await self.transport.call_packed(peer, cm.encode(request), timeout=timeout)
        return cm.reply_from_wire(request, value)

    def handle_here(self, request: cm.Request) -> Any:  # Any: as `call`, or an awaitable of it (the handler's)
        """Run this node's own handler of `request`, as if this node had sent it to itself."""
        return self.registry.handle_record(self.name, request)

    def _on_message(self, peer: str, obj: Any) -> None:  # Any: a msgpack value from a peer, checked by from_wire
        try:
            record = cm.from_wire(obj)
            if type(record) is cm.RaftMessage:
                raft_id = self._raft_id_of(peer)
                if raft_id and self.driver is not None:
                    self.driver.receive(raft_id, record.payload)
                return
            self.registry.handle_record(peer, record)
        except cm.MessageError as exc:
            log.warning("dropped an inter-node message from %s: %s", peer, exc)

    def _on_request(self, peer: str, obj: Any) -> Any:  # Any: a peer's msgpack value in, a reply value out
        result = self.registry.handle(peer, obj)  # MessageError: an error reply, the connection stays
        if inspect.isawaitable(result):
            return self._reply_when_done(result)
        return cm.to_wire(result) if cm.is_record(result) else result

    @staticmethod
    async def _reply_when_done(result: Awaitable[Any]) -> Any:  # Any: a handler's reply, then its wire value
        value = await result
        return cm.to_wire(value) if cm.is_record(value) else value

    def _on_peer_up(self, peer: str) -> None:
        raft_id = self._raft_id_of(peer)
        if raft_id and self.driver is not None:
            self.driver.peer_up(raft_id)
        log.info("cluster peer %s is up", peer)
        for hook in self.node.cluster_peer_hooks:
            hook(peer, True)

    def _on_peer_down(self, peer: str) -> None:
        raft_id = self._raft_id_of(peer)
        if raft_id and self.driver is not None:
            self.driver.peer_down(raft_id)
        log.warning("cluster peer %s is down or unreachable", peer)
        for hook in self.node.cluster_peer_hooks:
            hook(peer, False)

    def _leader_changed(self, leader: int) -> None:
        name = self.name if leader == self.raft_id else self._name_of(leader)
        log.info("metadata leader is now %s", name or "unknown")
        for hook in list(self.leader_hooks):
            hook(leader == self.raft_id)

    @property
    def is_leader(self) -> bool:
        """Does this node lead the metadata group (where the dynamic shovels run: runtime/shovel/)?"""
        return self.group is not None and self.group.is_leader

    # -- proposals ------------------------------------------------------------------------------------------
    def replicate(self, op: DefinitionOp) -> None:
        """Queue a change this node just made; it is proposed at the end of this loop iteration."""
        self._pending_ops.append(op)
        if self._flush_handle is None:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush_ops)

    def _flush_ops(self) -> None:
        self._flush_handle = None
        ops, self._pending_ops = self._pending_ops, []
        if not ops:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight.append(fut)
        task = asyncio.ensure_future(self._propose_until_done(ops))

        def done(t: asyncio.Task[int]) -> None:
            self._inflight.remove(fut)
            if t.cancelled():
                fut.cancel()
            elif t.exception() is not None:
                exc = t.exception()
                log.error("metadata change not committed (%d operations: %s); will retry: %s", len(ops),
                          ", ".join(sorted({ops_.kind_of(o) for o in ops})), exc)
                fut.set_exception(ClusterUnavailable(str(exc)))
                self._retry_later(ops)
            else:
                fut.set_result(None)
            if not fut.done():
                fut.cancel()
            fut.exception() if not fut.cancelled() else None  # consumed: nobody may be waiting

        task.add_done_callback(done)

    def _retry_later(self, ops: list[DefinitionOp]) -> None:
        """A change made here that did not commit stays a change to make: it is proposed again (with
        the same incarnation) until it commits, so the cluster converges on what this node did."""
        async def again() -> None:
            await self._propose_until_done(ops, timeout=None)
        asyncio.ensure_future(again())

    async def wait_replicated(self) -> None:
        """Until every change this node made so far is committed (ClusterUnavailable on timeout)."""
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_ops()
        for fut in list(self._inflight):
            await asyncio.shield(fut)
        hooks, self.post_commit = self.post_commit, []
        for hook in hooks:
            try:
                await asyncio.wait_for(hook(), self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - the change itself is committed; report and go on
                log.warning("after a metadata change: %r", exc)

    def choose_members(self, size: int, leader: str | None = None) -> list[str]:
        """`leader` (default: this node) first, then this node, then others up to `size`, running ones
        first, at random, one per node while there are nodes (a node of workers is one node: its workers
        share its machine; runtime/workers/membership.py). A quorum queue's first member is the node its
        leader locator chose."""
        import random
        first = [leader or self.name]
        if self.name not in first:
            first.append(self.name)
        others = [m for m in self.machine.members if m not in first]
        running = [m for m in others if self.transport.connected(m)]
        random.shuffle(running)
        rest = [m for m in others if m not in running]
        random.shuffle(rest)
        return membership.spread_over_nodes(first, running + rest, max(size, 1))

    def raft_id_of(self, name: str) -> int:
        if name == self.name:
            return self.raft_id
        m = self.machine.members.get(name)
        return m.raft_id if m is not None else self._raft_id_of(name)

    def name_of(self, raft_id: int) -> str | None:
        return self.name if raft_id == self.raft_id else self._name_of(raft_id)

    async def sync_peers(self, timeout: float = 1.0) -> None:
        """Wait (briefly) until every connected member has applied what this node has: a client that
        declares on this node and then publishes through another finds what it declared there."""
        index = self.machine.applied_index
        peers = self.transport.connected_peers()
        if not peers:
            return
        calls = [self.call(p, cm.Sync(index), timeout=timeout) for p in peers]
        await asyncio.gather(*calls, return_exceptions=True)

    async def _handle_sync(self, peer: str, req: cm.Sync) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await self._wait_applied(req.index, loop.time() + 1.0)
        except TimeoutError:
            return False
        return True

    @property
    def has_unreplicated(self) -> bool:
        return bool(self._pending_ops or self._inflight)

    async def barrier(self, timeout: float | None = None) -> None:
        """A read barrier: a no-op committed through the leader and applied here, so every change
        committed before this call is in this node's state."""
        await self._propose_until_done([ops_.Noop()], timeout=self.timeout_s if timeout is None else timeout)

    async def _propose_until_done(self, ops: list[DefinitionOp], timeout: float | None = -1.0) -> int:
        """Propose through whichever node leads; wait until applied here. Returns the entry's index."""
        loop = asyncio.get_running_loop()
        limit = self.timeout_s if timeout == -1.0 else timeout
        deadline = None if limit is None else loop.time() + limit
        data = encode_ops(ops, self.incarnation)  # stamped: this process applied them before proposing
        delay = RETRY_S
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                raise ClusterUnavailable("no majority of the cluster's metadata members answered in time")
            step = min(remaining, self.timeout_s) if remaining is not None else self.timeout_s
            try:
                index = await self._propose_once(data, step)
                await self._wait_applied(index, deadline)
                return index
            except (TimeoutError, NotLeader, PeerUnavailable, ProposalTimeout, RemoteError) as exc:
                log.debug("proposal retry: %r", exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    async def _propose_once(self, data: bytes, timeout: float) -> int:
        assert self.group is not None
        if self.group.is_leader:
            return int(await self.group.propose(data, timeout=timeout))
        leader = self._name_of(self.group.leader)
        if leader is None:
            raise NotLeader(0)
        return int(await self.call(leader, cm.Propose(data), timeout=timeout))

    def _applied(self, index: int) -> None:
        if not self._apply_waiters:
            return
        keep = []
        for want, fut in self._apply_waiters:
            if want <= index:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((want, fut))
        self._apply_waiters = keep

    async def _wait_applied(self, index: int, deadline: float | None) -> None:
        if self.machine.applied_index >= index:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._apply_waiters.append((index, fut))
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(fut, None if deadline is None else max(0.0, deadline - loop.time()))

    # -- requests from peers -------------------------------------------------------------------------------
    def _open_group(self) -> Group:
        """The metadata group. The transport is up before `start` opens the group, so a peer's request may
        come first: it is refused as the cluster being unavailable (the peer retries)."""
        if self.group is None:
            raise ClusterUnavailable(f"node {self.name} has not opened its metadata group yet (it is booting)")
        return self.group

    async def _handle_propose(self, peer: str, req: cm.Propose) -> int:
        group = self._open_group()
        if not group.is_leader:
            raise NotLeader(group.leader)
        return int(await group.propose(req.data, timeout=self.timeout_s))

    async def _handle_join(self, peer: str, req: cm.Join) -> cm.JoinReply:
        group = self._open_group()
        if not group.is_leader:
            leader = self._name_of(group.leader)
            if leader is None:
                raise ValueError("no metadata leader at the moment; retry")
            reply: cm.JoinReply = await self.call(leader, req, timeout=self.timeout_s * 2)
            return reply
        async with self._join_lock:
            name = req.name
            await self._propose_until_done([ops_.ClusterJoin(name, req.host, req.port)])
            member = self.machine.members[name]
            self._learn(member)
            if req.promote and member.raft_id not in self.machine.voters:
                await self._open_group().add_voter(member.raft_id, timeout=self.timeout_s)
                log.info("node %s joined the cluster as raft member %d", name, member.raft_id)
            return cm.JoinReply(member.raft_id, [m.to_list() for m in self.machine.members.values()])

    async def _handle_leave(self, peer: str, req: cm.Leave) -> str:
        return await self.forget(req.name)

    def _handle_status(self, peer: str, req: cm.Status) -> cm.NodeStatus:
        return self.local_status()

    # -- operations (hutchctl, the HTTP API) -------------------------------------------------------------
    async def forget(self, name: str) -> str:
        """Remove a stopped node from the cluster (run on any remaining node). A node of workers is named
        by its node name: each of its workers (members) is removed."""
        workers = [m for m in self.machine.members if m != name and node_of_worker(m) == name]
        if name not in self.machine.members and workers:
            if membership.same_node(workers[0], self.name):
                raise ValueError("a node cannot forget itself; run forget_cluster_node on another member")
            running = [m for m in workers if self.transport.connected(m)]
            if running:
                raise ValueError(f"node {name!r} is running; stop it before forgetting it")
            for m in sorted(workers):
                await self.forget(m)
            return name
        if name == self.name:
            raise ValueError("a node cannot forget itself; run forget_cluster_node on another member")
        if name not in self.machine.members:
            raise LookupError(f"node {name!r} is not a member of this cluster")
        if self.transport.connected(name):
            raise ValueError(f"node {name!r} is running; stop it before forgetting it")
        group = self._open_group()
        if not group.is_leader:
            leader = self._name_of(group.leader)
            if leader is None:
                raise ClusterUnavailable("no metadata leader at the moment")
            return await self.call(leader, cm.Leave(name), timeout=self.timeout_s * 2)
        async with self._join_lock:
            raft_id = self.machine.members[name].raft_id
            if raft_id in self.machine.voters:
                await self._open_group().remove_voter(raft_id, timeout=self.timeout_s)
            await self._propose_until_done([ops_.ClusterLeave(name)])
        log.info("node %s was removed from the cluster", name)
        return name

    async def join(self, seed: str) -> None:
        """`hutchctl join_cluster`: a node alone in its own cluster joins another one. As RabbitMQ's
        reset + join_cluster, it first drops its own definitions (and the messages of its queues)."""
        others = [m for m in self.machine.members if m != self.name]
        if others:
            raise ValueError(f"node {self.name} is already clustered with {', '.join(sorted(others))}; "
                             "forget it there first")
        name, _host, _port = parse_seed(seed, self.name)
        reply = await self._join_through(seed)
        log.warning("joining the cluster of %s: this node's own definitions and messages are dropped", name)
        assert self.driver is not None
        await self.driver.stop()
        shutil.rmtree(os.path.join(self.directory, "raft"), ignore_errors=True)
        self.node.reset_to([])
        self.machine = MetadataMachine(self.node, self.incarnation)
        self.machine.on_applied = self._applied
        self.raft_id = reply.raft_id
        self._save_identity(self.raft_id)
        self.driver = RaftDriver(self.raft_id, os.path.join(self.directory, "raft"), self._send_raft,
                                 tick_s=self.config.cluster_tick_ms / 1000,
                                 log_options=self._log_options(), load=self.node.loop_load)
        await self.driver.start()
        self.group = self.driver.open_group(METADATA_GROUP, self.machine, bootstrap_voters=None)
        self.group.on_leader_change = self._leader_changed
        for v in reply.members:
            self._learn(Member.from_list(v))
        await self._join_through(seed, promote=True)
        await self.barrier()

    async def join_as_node_of_workers(self, seed: str) -> str:
        """`hutchctl join_cluster` on a node of workers (here its worker 0): as RabbitMQ's `stop_app;
        reset; join_cluster; start_app`, the supervisor stops every worker, drops their data and starts
        them again with `--join seed` (runtime/workers/supervisor.py). Checked first: the node is alone
        (its own workers are its only members) and the seed answers (when this node may dial other
        nodes: it was given an inter-node port). Returns the seed's node name; ValueError saying why not."""
        me = node_of_worker(self.name)
        others = sorted({node_of_worker(m) for m in self.machine.members if not membership.same_node(m, self.name)})
        if others:
            raise ValueError(f"node {me} is already clustered with {', '.join(others)}; forget it there first")
        if self.rejoin is None:
            raise ValueError(f"node {me}: this worker cannot ask its supervisor to restart the workers")
        name, host, port = parse_seed(seed, me)
        if membership.same_node(name, self.name):
            raise ValueError(f"cannot join through {seed}: that is this node's own name")
        if self.transport.network:
            self.transport.set_peer(name, host, port)
            found = name
            try:
                deadline = asyncio.get_running_loop().time() + min(10.0, self.timeout_s)
                found = await self._seed_member(seed, name, host, port, deadline)
            finally:
                self.transport.remove_peer(found)
                self.transport.remove_peer(name)
        if not self.rejoin(seed):
            raise ClusterUnavailable(f"node {me}: its supervisor did not take the request")
        log.warning("joining the cluster of %s: the supervisor restarts this node's workers, dropping their "
                    "definitions and messages", name)
        return node_of_worker(name)

    def _members_of(self, names: list[str]) -> list[str]:
        """The members `names` mean: a node's name means every worker of it (and itself, as a name)."""
        out = list(names)
        for m in self.machine.members:
            if m not in out and node_of_worker(m) in names and not membership.same_node(m, self.name):
                out.append(m)
        return out

    def _handle_block(self, peer: str, req: cm.BlockPeers) -> bool:
        if not membership.same_node(peer, self.name):
            raise ValueError("only a worker of this node blocks its links")
        for name in req.names:
            (self.transport.block if req.blocked else self.transport.unblock)(name)
        return True

    async def set_blocked(self, names: list[str], blocked: bool) -> list[str]:
        """Fault injection (`/api/cluster-faults`): cut (or restore) the links to those nodes as a network
        partition would. On a node of workers every worker cuts its links to every worker of those nodes
        (this one tells the others), so that the node is cut off as a whole. Returns the members cut."""
        targets = self._members_of(names)
        for name in targets:
            (self.transport.block if blocked else self.transport.unblock)(name)
        calls = [self.call(p, cm.BlockPeers(targets, blocked), timeout=5.0) for p in self.siblings()]
        await asyncio.gather(*calls, return_exceptions=True)
        return targets

    def local_status(self) -> cm.NodeStatus:
        return cm.NodeStatus(self.name, sorted(self.node.alarms), True, self.raft_id)

    async def status(self) -> dict[str, Any]:  # Any: the JSON document of `hutchctl cluster_status`
        """The cluster as its nodes: a node of workers is one node (its workers are Raft members, listed
        in `members` with their `node`, never as nodes of their own); a node runs while one of its
        workers answers; `partitions` names the nodes none of whose workers this one reaches."""
        members = sorted(self.machine.members.values(), key=lambda m: m.raft_id)
        me = node_of_worker(self.name)
        running = [self.name] + sorted(self.transport.connected_peers())
        calls = {p: asyncio.ensure_future(self.call(p, cm.Status(), timeout=2.0)) for p in running[1:]}
        answers: dict[str, list[str]] = {}
        for peer, fut in calls.items():
            try:
                answers[peer] = list((await fut).alarms)
            except Exception:  # noqa: BLE001 - a peer that stopped answering is reported as not running
                running.remove(peer)
        nodes = membership.nodes_of([me, *(m.name for m in members)])
        running_nodes = list(membership.nodes_of(running))
        alarms: list[dict[str, Any]] = [{"node": me, "alarms": sorted(self.node.alarms)}]
        for node in running_nodes[1:]:
            found = sorted({a for peer, names in answers.items() if node_of_worker(peer) == node for a in names})
            alarms.append({"node": node, "alarms": found})
        group = self.group.status() if self.group is not None else {}
        leader = self._name_of(group.get("leader", 0)) if group.get("leader") != self.raft_id else self.name
        unreachable = [n for n in nodes if n not in running_nodes]
        return {
            "cluster_name": self.config.cluster_name,
            "disk_nodes": list(nodes),
            "running_nodes": running_nodes,
            "members": [{"name": m.name, "node": node_of_worker(m.name), "raft_id": m.raft_id,
                         "address": f"{m.host}:{m.port}", "voter": m.raft_id in self.machine.voters,
                         "running": m.name in running}
                        for m in members],
            "partitions": [{"node": me, "unreachable": unreachable}] if unreachable else [],
            "alarms": alarms,
            "metadata": {"leader": node_of_worker(leader) if leader else leader, "leader_member": leader,
                         "term": group.get("term"), "commit": group.get("commit"),
                         "applied": self.machine.applied_index},
        }
