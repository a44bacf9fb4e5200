"""A whole Raft cluster in one process, driven by one seed: nodes, a faulty network, a faithful driver.

Owns:
- `Network`: messages in flight with a delivery tick; drops, duplicates, delays (hence reorders) and
  partitions (a blocked ordered pair drops at send and at delivery).
- `SimNode`: one member: its durable `MemoryStorage` (survives crashes), its `RawNode` (lost on crash), the
  Ready it is persisting (lost on crash: written but not synced), and a state machine (applied commands).
- `Cluster`: the driver loop of docs/raft.md (persist -> send -> apply -> advance) with a sync latency, and
  the fault/operation primitives the scenario (`run.py`) picks from.

Nothing here reads a clock or a global random: time is `Cluster.now` (ticks), randomness is `Cluster.rng`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass

from hutch.raft import (
    ConfChange,
    Config,
    ConfState,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RawNode,
    Ready,
    StateType,
)

from .checker import Checker, SimViolation, decode_commands, encode_commands

MAX_MESSAGES_PER_TICK = 20_000


@dataclass
class NetParams:
    drop: float = 0.0
    dup: float = 0.0
    max_delay: int = 2  # ticks; a delay of 0 delivers within the same tick


class Network:
    def __init__(self, rng: random.Random, params: NetParams) -> None:
        self.rng = rng
        self.params = params
        self.blocked: set[tuple[int, int]] = set()
        self._q: list[tuple[int, int, Message]] = []
        self._seq = 0
        self.sent = 0
        self.delivered = 0
        self.by_type: dict[MessageType, int] = {}

    def send(self, m: Message, now: int) -> None:
        self.sent += 1
        self.by_type[m.type] = self.by_type.get(m.type, 0) + 1
        p = self.params
        if (m.sender, m.to) in self.blocked or (p.drop and self.rng.random() < p.drop):
            return
        copies = 2 if p.dup and self.rng.random() < p.dup else 1
        for _ in range(copies):
            self._seq += 1
            at = now + (self.rng.randint(0, p.max_delay) if p.max_delay else 0)
            # a random second key reorders messages due in the same tick
            heapq.heappush(self._q, (at, self.rng.random(), m))

    def pop_due(self, now: int) -> Message | None:
        while self._q and self._q[0][0] <= now:
            m = heapq.heappop(self._q)[2]
            if (m.sender, m.to) in self.blocked:
                continue
            self.delivered += 1
            return m
        return None

    def partition(self, side: set[int], all_ids: list[int]) -> None:
        other = [i for i in all_ids if i not in side]
        for a in side:
            for b in other:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def heal(self) -> None:
        self.blocked.clear()


class SimNode:
    def __init__(self, node_id: int, voters: tuple[int, ...]) -> None:
        self.id = node_id
        self.storage = MemoryStorage.bootstrap(voters) if voters else MemoryStorage()
        self.raw: RawNode | None = None
        self.pending: Ready | None = None
        self.pending_at = 0
        self.commands: list[bytes] = []
        self.conf = ConfState()  # the state machine's view: the configuration as of applied_index
        self.applied_index = 0
        self.restarts = 0


class Cluster:
    def __init__(
        self,
        seed: int,
        ids: list[int],
        voters: tuple[int, ...],
        net: NetParams,
        *,
        election_tick: int = 10,
        heartbeat_tick: int = 2,
        max_sync_delay: int = 1,
        compact_every: int = 0,
        max_entries_per_msg: int = 4,
        max_inflight_msgs: int = 4,
        send_before_persist: bool = False,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.ids = ids
        self.net = Network(random.Random(self.rng.getrandbits(64)), net)
        self.election_tick = election_tick
        self.heartbeat_tick = heartbeat_tick
        self.max_sync_delay = max_sync_delay
        self.compact_every = compact_every
        self.max_entries_per_msg = max_entries_per_msg
        self.max_inflight_msgs = max_inflight_msgs
        self.send_before_persist = send_before_persist  # a deliberately broken driver, for self-tests
        self.trace = trace
        self.checker = Checker()
        self.now = 0
        self.nodes = {i: SimNode(i, voters if i in voters else ()) for i in ids}
        self.live: dict[int, RawNode] = {}
        self.next_command = 0
        self._last_sig: dict[int, tuple[object, ...]] = {}
        for i in ids:
            self.start(i)

    # -- node lifecycle ------------------------------------------------------------------------

    def start(self, node_id: int) -> None:
        n = self.nodes[node_id]
        n.restarts += 1
        snap = n.storage.snapshot()
        cfg = Config(
            id=node_id,
            election_tick=self.election_tick,
            heartbeat_tick=self.heartbeat_tick,
            max_entries_per_msg=self.max_entries_per_msg,
            max_inflight_msgs=self.max_inflight_msgs,
            max_size_per_msg=256,
            rng=random.Random(self.rng.getrandbits(64)),
            applied=snap.index,
        )
        n.raw = RawNode(cfg, n.storage)
        n.commands = decode_commands(snap.data)
        n.conf = snap.meta.conf_state
        n.applied_index = snap.index
        n.pending = None
        self.live[node_id] = n.raw
        self.checker.on_restart(node_id)
        self._trace(f"start {node_id} term={n.raw.raft.term} last={n.raw.raft.log.last_index()}")

    def crash(self, node_id: int) -> None:
        n = self.nodes[node_id]
        n.raw = None
        n.pending = None  # written but not synced: lost
        self.live.pop(node_id, None)
        self._trace(f"crash {node_id}")

    # -- the driver loop -----------------------------------------------------------------------

    def drive(self, node_id: int) -> None:
        n = self.nodes[node_id]
        raw = n.raw
        while raw is not None and n.pending is None and raw.has_ready():
            rd = raw.ready()
            if self.send_before_persist:
                for m in rd.messages:
                    self.net.send(m, self.now)
                rd.messages = []
            delay = self.rng.randint(0, self.max_sync_delay) if rd.must_sync and self.max_sync_delay else 0
            if delay:
                n.pending = rd
                n.pending_at = self.now + delay
                return
            self.complete(n, rd)

    def complete(self, n: SimNode, rd: Ready) -> None:
        raw = n.raw
        assert raw is not None
        st = n.storage
        # 1. persist (and "fsync")
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
        if rd.entries:
            self.checker.on_persist(n.id, rd.entries, st)
            st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        # 2. send
        for m in rd.messages:
            self.net.send(m, self.now)
        # 3. apply
        if rd.snapshot is not None:
            n.commands = decode_commands(rd.snapshot.data)
            n.conf = rd.snapshot.meta.conf_state
            n.applied_index = rd.snapshot.index
            self.checker.on_apply_snapshot(n.id, n.applied_index, n.commands)
        for e in rd.committed_entries:
            self.checker.on_apply(n.id, n.applied_index, e)
            n.applied_index = e.index
            if e.type is EntryType.NORMAL and e.data:
                n.commands.append(e.data)
            elif e.type is EntryType.CONF_CHANGE:
                n.conf = ConfChange.decode(e.data).apply_to(n.conf)
        # 4. advance
        raw.advance(rd)
        if self.compact_every and n.applied_index - st.first_index() + 1 >= self.compact_every:
            data = encode_commands(n.commands)
            st.create_snapshot(n.applied_index, n.conf, data)
            st.compact(n.applied_index - self.rng.randint(0, 2))

    def finish_syncs(self) -> None:
        for n in self.nodes.values():
            if n.pending is not None and n.pending_at <= self.now:
                rd, n.pending = n.pending, None
                self.complete(n, rd)
                self.drive(n.id)
                self.check()

    def check(self) -> None:
        if self.trace is not None:
            for i, raw in self.live.items():
                r = raw.raft
                sig = (r.state.name, r.term, r.log.config.current.voters, r.log.last_index(), r.log.committed)
                if self._last_sig.get(i) != sig:
                    self._last_sig[i] = sig
                    self._trace(f"node {i}: {sig[0]} term={sig[1]} voters={sig[2]} last={sig[3]} commit={sig[4]}")
        self.checker.check(self.live)

    def step_time(self, tick_skip: float = 0.0) -> None:
        """One tick of simulated time: deliver what is due, finish syncs, tick every live node."""
        delivered = 0
        while (m := self.net.pop_due(self.now)) is not None:
            delivered += 1
            if delivered > MAX_MESSAGES_PER_TICK:
                raise SimViolation(f"livelock: more than {MAX_MESSAGES_PER_TICK} messages delivered in tick {self.now}")
            raw = self.live.get(m.to)
            if raw is None:
                continue
            raw.step(m)
            self.drive(m.to)
            self.check()
        self.finish_syncs()
        for node_id in list(self.live):
            if tick_skip and self.rng.random() < tick_skip:
                continue  # clock drift: this node's tick comes late
            self.live[node_id].tick()
            self.drive(node_id)
            self.check()
        self.now += 1

    # -- operations ----------------------------------------------------------------------------

    def leaders(self) -> list[int]:
        return [i for i, raw in self.live.items() if raw.raft.state is StateType.LEADER]

    def leader(self) -> int | None:
        """The live leader of the highest term, if any."""
        best: tuple[int, int] | None = None
        for i, raw in self.live.items():
            if raw.raft.state is StateType.LEADER and (best is None or raw.raft.term > best[0]):
                best = (raw.raft.term, i)
        return best[1] if best else None

    def propose(self, node_id: int, data: bytes | None = None) -> int | None:
        raw = self.live.get(node_id)
        if raw is None:
            return None
        if data is None:
            self.next_command += 1
            data = b"c%d" % self.next_command
        try:
            index = raw.propose(data)
        except ProposalDroppedError:
            return None
        self._trace(f"propose {data!r} at {node_id} -> {index}")
        self.drive(node_id)
        self.check()
        return index

    def propose_conf_change(self, node_id: int, cc: ConfChange) -> int | None:
        raw = self.live.get(node_id)
        if raw is None:
            return None
        try:
            index = raw.propose_conf_change(cc)
        except ProposalDroppedError:
            return None
        self._trace(f"conf change {cc} at {node_id} -> {index}")
        self.drive(node_id)
        self.check()
        return index

    def transfer_leader(self, node_id: int, target: int) -> None:
        raw = self.live.get(node_id)
        if raw is not None:
            self._trace(f"transfer {node_id} -> {target}")
            raw.transfer_leader(target)
            self.drive(node_id)
            self.check()

    def voters(self) -> tuple[int, ...]:
        """The configuration as the current leader sees it (or the most common one without a leader)."""
        lead = self.leader()
        if lead is not None:
            return self.live[lead].raft.log.config.current.voters
        counts: dict[tuple[int, ...], int] = {}
        for n in self.nodes.values():
            if n.raw is not None:
                v = n.raw.raft.log.config.current.voters
                counts[v] = counts.get(v, 0) + 1
        return max(counts, key=lambda v: counts[v]) if counts else ()

    def _trace(self, what: str) -> None:
        if self.trace is not None:
            self.trace(f"[t={self.now}] {what}")
