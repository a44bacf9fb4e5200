"""What a node's queue link tells the other nodes (and workers) about itself on a timer, never per message.

Owns: `StatsPush`, the counts of this node's queues pushed every `STATS_INTERVAL_S` to every connected peer
(those that changed; all of them after a peer comes up) and the peers' counts set on their stand-ins here
(`QueueStats`), so listings and the HTTP API show a queue's figures wherever it lives; and `LoadTell`,
this worker's loop saturation told to the other workers of its node (`LoopSaturated`, never to another
node) as it changes, so their flow rules judge a backlog as the one loop of a node would.

Rules:
- No timer runs for the load while this loop is not saturated (an idle worker's loop sleeps).
- Both are parts of remote.py's `QueueLink`, which starts, stops and tells them of peers coming and going.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from hutch.cluster import messages as cm
from hutch.core.credit_flow import WINDOW_S
from hutch.runtime.queue_types.remote_queue import RemoteQueue
from hutch.runtime.workers.spec import node_of_worker

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService

STATS_INTERVAL_S = 1.0  # how often a node tells the others the counts of its queues (when they change)


class StatsPush:
    """The queue counts this node tells the others, and those they tell it (one per `QueueLink`)."""

    def __init__(self, node: Node, cluster: ClusterService) -> None:
        self.node = node
        self.transport = cluster.transport
        self._send = cluster.send
        self._stats_sent: dict[tuple[str, str], tuple[int, ...]] = {}  # what peers were last told
        self._stats_handle: asyncio.TimerHandle | None = None
        cluster.register(cm.QueueStats, self._on_stats)

    def start(self) -> None:
        self._stats_handle = asyncio.get_running_loop().call_later(STATS_INTERVAL_S, self._push_stats)

    def stop(self) -> None:
        if self._stats_handle is not None:
            self._stats_handle.cancel()
            self._stats_handle = None

    def peer_up(self) -> None:
        """A peer came up: the next push tells everyone everything."""
        self._stats_sent.clear()

    def _push_stats(self, full: bool = False) -> None:
        """Every STATS_INTERVAL_S: tell the other nodes the counts of this node's queues that changed
        (all of them to a node that just came up), so their listings and the HTTP API show them."""
        self._stats_handle = asyncio.get_running_loop().call_later(STATS_INTERVAL_S, self._push_stats)
        changed = []
        sent = self._stats_sent
        for vhost in self.node.vhosts.values():
            for q in vhost.queues.values():
                if q.remote:
                    continue
                row = (q.message_count, q.unacked_count, q.consumer_count, q.message_bytes, q.stat_published,
                       q.stat_delivered, q.stat_acked, q.stat_redelivered, q.stat_get,
                       getattr(q, "stat_dead_lettered", 0), getattr(q, "stat_dropped", 0),
                       getattr(q, "stat_rejected", 0))
                key = (vhost.name, q.name)
                if full or sent.get(key) != row:
                    sent[key] = row
                    changed.append([vhost.name, q.name, *row])
        if changed:
            for peer in self.transport.connected_peers():
                self._send(peer, cm.QueueStats(changed))

    def _on_stats(self, peer: str, stats: cm.QueueStats) -> None:
        vhosts = self.node.vhosts
        for row in stats.rows:
            v = vhosts.get(row[0])
            q = v.queues.get(row[1]) if v is not None else None
            if isinstance(q, RemoteQueue):
                q.set_stats(row[2:14])



class LoadTell:
    """This worker's loop saturation, told to the other workers of its node, and theirs, kept in the node's
    `LoopLoad` (one per `QueueLink`)."""

    def __init__(self, node: Node, cluster: ClusterService) -> None:
        self.node = node
        self.transport = cluster.transport
        self._send = cluster.send
        self._load_handle: asyncio.TimerHandle | None = None
        self._told_saturated = False  # what the other workers were last told of this loop (`LoopSaturated`)
        cluster.register(cm.LoopSaturated, self._on_loop_saturated)

    def start(self) -> None:
        """In a worker of a node of workers: tell the others as this loop's saturation changes."""
        if self.node.config.worker_index is not None:
            self.node.loop_load.on_saturated = self._loop_saturated

    def stop(self) -> None:
        if self.node.loop_load.on_saturated == self._loop_saturated:
            self.node.loop_load.on_saturated = None
        if self._load_handle is not None:
            self._load_handle.cancel()
            self._load_handle = None

    def peer_up(self, peer: str) -> None:
        """`peer` came up: told at once if this loop is saturated and it is a worker of this node."""
        if self._told_saturated and peer in self._siblings():
            self._send(peer, cm.LoopSaturated(True))

    def peer_down(self, peer: str) -> None:
        self.node.loop_load.saturated_peers.discard(peer)

    def _siblings(self) -> list[str]:
        """The other workers of this node that are connected (never other nodes of a cluster: their cores
        are their own)."""
        mine = node_of_worker(self.node.name)
        return [p for p in self.transport.connected_peers() if node_of_worker(p) == mine]

    def _loop_saturated(self) -> None:
        """This worker's loop just became saturated (`LoopLoad.on_saturated`, as a window of input closes):
        tell the other workers (`LoopSaturated`), so their flow rules judge a backlog as the one loop of
        a node would, and watch every WINDOW_S for the end of it (`_tell_load`). No timer runs while the
        loop is not saturated: an idle worker's loop sleeps."""
        if self._told_saturated:
            return
        self._told_saturated = True
        for peer in self._siblings():
            self._send(peer, cm.LoopSaturated(True))
        if self._load_handle is None:
            self._load_handle = asyncio.get_running_loop().call_later(WINDOW_S, self._tell_load)

    def _tell_load(self) -> None:
        """Every WINDOW_S while the other workers were told this loop is saturated: tell them when it no
        longer is (then the timer stops until `_loop_saturated`)."""
        self._load_handle = None
        if self.node.loop_load.own_saturated():
            self._load_handle = asyncio.get_running_loop().call_later(WINDOW_S, self._tell_load)
            return
        self._told_saturated = False
        for peer in self._siblings():
            self._send(peer, cm.LoopSaturated(False))

    def _on_loop_saturated(self, peer: str, rec: cm.LoopSaturated) -> None:
        if node_of_worker(peer) != node_of_worker(self.node.name):
            return  # another node's load is not this node's
        peers = self.node.loop_load.saturated_peers
        if rec.saturated:
            peers.add(peer)
        else:
            peers.discard(peer)
