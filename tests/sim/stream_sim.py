"""A seeded simulation of one replicated stream: the replica protocol (hutch.cluster.stream_replica) on
N members, the coordinator (hutch.cluster.stream_coordinator) as the linearizable object its Raft group
makes of it, a network that drops, delays and reorders, disks that lose what was not synced, crashes,
restarts, isolated members, membership changes, and a writer that keeps writing on the wrong side of a
partition.

Checked after every step: no two members ever commit different chunks at one offset; a committed chunk
is never truncated (the machine asserts it). After healing: every member holds the same log, every
confirmed chunk is in it at its offset, each payload once, in publish order, and its offsets are dense
from first to last (every offset holds a published payload: no writer change took one).

Writers go idle now and then (no publish for a while), so that new writers carry older chunks by their
recorded start alone; `grown` starts from a stream of one member whose log holds chunks of epoch 1 (or 0, as
written before: odd seeds) (a single-node stream made replicated, then given members).

`run_stream_seed(seed)` runs one schedule; the same seed always gives the same run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.cluster.stream_tail import Tail


class StreamViolation(AssertionError):
    pass


@dataclass
class Disk:
    """One member's files: durable chunks, plus the ones written but not synced (lost by a crash)."""
    first: int = 0
    synced: list[sr.ChunkRef] = field(default_factory=list)
    unsynced: list[sr.ChunkRef] = field(default_factory=list)

    def chunks(self) -> list[sr.ChunkRef]:
        return self.synced + self.unsynced

    def tail(self) -> Tail:
        epochs: list[tuple[int, int]] = []
        for c in self.synced:
            if epochs and epochs[-1][0] == c.epoch:
                epochs[-1] = (c.epoch, c.next_offset)
            else:
                epochs.append((c.epoch, c.next_offset))
        nxt = self.synced[-1].next_offset if self.synced else self.first
        return Tail(self.first, nxt, tuple(epochs)).check()

    def truncate(self, next_offset: int) -> None:
        self.synced = [c for c in self.synced if c.chunk_id < next_offset]
        self.unsynced = [c for c in self.unsynced if c.chunk_id < next_offset]


@dataclass
class SimNode:
    name: str
    disk: Disk = field(default_factory=Disk)
    member: sr.StreamMember | None = None
    isolated: bool = False
    appended: list[sr.ChunkRef] = field(default_factory=list)  # this incarnation's own chunks (writer)
    commit_seen: int = 0
    incarnation: int = 0
    # the runtime's commit file: the points recorded (the last few); a crash keeps an older one or none
    commit_file: list[int] = field(default_factory=list)


@dataclass
class StreamStats:
    seed: int
    ticks: int = 0
    published: int = 0
    confirmed: int = 0
    crashes: int = 0
    isolations: int = 0
    elections: int = 0
    member_changes: int = 0
    resets: int = 0
    retentions: int = 0
    truncations: int = 0
    dropped: int = 0
    writer_epochs: int = 0
    carried: int = 0     # of them, those that began holding chunks not known committed
    by_record: int = 0   # commits of older chunks made by a recorded start alone (no chunk of the epoch yet)
    idle: int = 0        # periods without publishes


class StreamSim:
    def __init__(self, seed: int, n: int = 3, *, drop: float = 0.05, max_delay: int = 4,
                 faults: bool = True, spare: int = 1, retention: bool = True, grown: int = 0) -> None:
        self.retention = retention
        self.rng = random.Random(seed)
        self.stats = StreamStats(seed)
        names = [f"n{i + 1}" for i in range(n + spare)]
        self.nodes = {name: SimNode(name) for name in names}
        self.drop, self.max_delay, self.faults = drop, max_delay, faults
        self.now = 0
        self.net: list[tuple[int, int, str, str, object]] = []  # (due, seq, src, dst, message)
        self.seq = 0
        self.down_since: int | None = None
        self.publishing = True
        self.idle_until = 0
        self.truth: dict[int, bytes] = {}          # chunk id -> data, of every committed chunk seen
        self.confirmed: dict[int, bytes] = {}      # chunk id -> data, of chunks whose writer confirmed them
        self.next_payload = 0
        if grown:
            # one member's files of the single-node path, committed (confirmed) there: epoch 1 (osiris's
            # first, what a stream of one node writes), or epoch 0 (what it wrote before) on odd seeds
            disk = self.nodes[names[0]].disk
            epoch = seed % 2 ^ 1
            for _ in range(grown):
                k = self.rng.randint(1, 3)
                first = disk.synced[-1].next_offset if disk.synced else 0
                c = sr.ChunkRef(epoch, first, first + k,
                                json.dumps(list(range(self.next_payload, self.next_payload + k))).encode())
                self.next_payload += k
                disk.synced.append(c)
                self.confirmed[c.chunk_id] = self.truth[c.chunk_id] = c.data
        self.coord = sc.apply(sc.NONE, sc.Declare(tuple(names[:1] if grown else names[:n]), names[0]))
        for node in self.nodes.values():
            node.member = self._new_member(node)
        for node in self.nodes.values():
            self._observe(node)

    # -- plumbing -------------------------------------------------------------------------------------

    def _new_member(self, node: SimNode) -> sr.StreamMember:
        node.incarnation += 1
        known = node.commit_file[-1] if node.commit_file else 0
        return sr.StreamMember(node.name, node.disk.tail(), fenced=self.coord.epoch, commit=known,
                               session_base=node.incarnation << 32,
                               ship_bytes=self.rng.choice([40, 200, 1 << 20]),
                               max_inflight=self.rng.choice([1, 2, 4]))

    def _send(self, src: str, dst: str, msg: object) -> None:
        if self.rng.random() < self.drop:
            self.stats.dropped += 1
            return
        self.seq += 1
        self.net.append((self.now + self.rng.randint(1, self.max_delay), self.seq, src, dst, msg))

    def _cut(self, a: str, b: str) -> bool:
        return self.nodes[a].isolated or self.nodes[b].isolated if b != "coord" else self.nodes[a].isolated

    def _observe(self, node: SimNode) -> None:
        if node.member is not None and not node.isolated:
            m = node.member
            before = (m.role, m.epoch)
            effects = m.observe(self.coord.view())
            if m.role is sr.Role.WRITER and (m.role, m.epoch) != before:
                # what it appended in an earlier epoch may have been cut and its offsets reused: only
                # this epoch's own appends are confirmed by this epoch's commit point
                node.appended = []
                self.stats.writer_epochs += 1
                self.stats.carried += m.carry
            self._run(node, effects)

    def _coord_apply(self, cmd: sc.Command) -> None:
        before = self.coord
        self.coord = sc.apply(self.coord, cmd)
        if self.coord.writer is not None and before.writer is None:
            self.stats.elections += 1
        if self.coord is not before:
            self.down_since = None

    def _run(self, node: SimNode, effects: list[sr.Effect]) -> None:
        m = node.member
        assert m is not None
        for e in effects:
            if isinstance(e, sr.Send):
                self._send(node.name, e.to, e.message)
            elif isinstance(e, sr.Report):
                self._send(node.name, "coord", sc.TailReport(e.sender, e.epoch, e.tail))
            elif isinstance(e, sr.Stable):
                self._send(node.name, "coord", sc.EpochStable(e.epoch))
            elif isinstance(e, sr.Begin):
                self._send(node.name, "coord", sc.EpochStart(e.epoch, e.tail))
            elif isinstance(e, sr.Reelect):
                self._send(node.name, "coord", sc.WriterDown(e.epoch))
            elif isinstance(e, sr.Ship):
                self._ship(node, e)
            elif isinstance(e, sr.Write):
                node.disk.unsynced.extend(e.chunks)
            elif isinstance(e, sr.Truncate):
                self.stats.truncations += 1
                node.disk.truncate(e.next_offset)
            elif isinstance(e, sr.Reset):
                self.stats.resets += 1
                node.disk = Disk(first=e.first)
            elif isinstance(e, sr.Committed):
                if m.role is sr.Role.WRITER and m.carry and e.next_offset == m.start > node.commit_seen:
                    self.stats.by_record += 1
                self._committed(node, e.next_offset)

    def _ship(self, node: SimNode, e: sr.Ship) -> None:
        m = node.member
        assert m is not None
        chunks, size, nxt = [], 0, e.start
        written = node.disk.chunks()
        if e.start not in {c.chunk_id for c in written}:
            raise StreamViolation(f"{node.name} asked to ship from {e.start}, not a chunk it holds")
        for c in written:
            if c.chunk_id < e.start:
                continue
            if chunks and size + len(c.data) > e.max_bytes:
                break
            chunks.append(c)
            size += len(c.data)
            nxt = c.next_offset
        self._send(node.name, e.peer, sr.Chunks(m.epoch, tuple(chunks), m.commit))
        self._run(node, m.shipped(e.peer, nxt))

    def _committed(self, node: SimNode, next_offset: int) -> None:
        if next_offset < node.commit_seen:
            raise StreamViolation(f"{node.name}'s commit point went back: {node.commit_seen} -> {next_offset}")
        node.commit_seen = next_offset
        node.commit_file = [*node.commit_file[-7:], next_offset]
        for c in node.disk.chunks():
            if c.next_offset > next_offset:
                break
            if c.chunk_id < node.disk.first:
                continue
            seen = self.truth.setdefault(c.chunk_id, c.data)
            if seen != c.data:
                raise StreamViolation(f"offset {c.chunk_id} committed as {seen!r} and as {c.data!r}")
        m = node.member
        if m is not None and m.role is sr.Role.WRITER:
            for c in node.appended:
                if c.next_offset <= next_offset and c.chunk_id not in self.confirmed:
                    self.confirmed[c.chunk_id] = c.data
                    self.stats.confirmed += 1

    # -- one tick ---------------------------------------------------------------------------------------

    def step(self) -> None:
        self.now += 1
        due = sorted(x for x in self.net if x[0] <= self.now)
        self.net = [x for x in self.net if x[0] > self.now]
        for _, _, src, dst, msg in due:
            if self._cut(src, dst):
                continue
            if dst == "coord":
                assert isinstance(msg, sc.TailReport | sc.WriterDown | sc.EpochStable | sc.EpochStart)
                self._coord_apply(msg)
                continue
            node = self.nodes[dst]
            if node.member is not None:
                self._run(node, node.member.step(msg))
        for node in self.nodes.values():
            m = node.member
            if m is None:
                continue
            if node.disk.unsynced and self.rng.random() < 0.5:  # a sync completes
                node.disk.synced.extend(node.disk.unsynced)
                node.disk.unsynced = []
                self._run(node, m.written(node.disk.tail().next))
            if self.rng.random() < 0.5:
                self._observe(node)
            if self.retention and self.rng.random() < 0.02:
                self._retain(node)
            self._run(node, m.tick())
            if self.publishing and self.now >= self.idle_until and m.role is sr.Role.WRITER \
                    and self.rng.random() < 0.6:
                self._publish(node)
        if self.faults and self.now >= self.idle_until and self.rng.random() < 0.01:
            self.idle_until = self.now + self.rng.randint(5, 40)  # nobody publishes for a while
            self.stats.idle += 1
        self._detect_writer_down()
        if self.faults:
            self._fault()

    def _retain(self, node: SimNode) -> None:
        """Retention on one member: remove the segments before a committed chunk (each member applies
        retention to its own files, as osiris does)."""
        m = node.member
        assert m is not None
        cut = [c.chunk_id for c in node.disk.synced if c.chunk_id <= m.commit and c.chunk_id > node.disk.first]
        if not cut:
            return
        first = self.rng.choice(cut)
        node.disk.synced = [c for c in node.disk.synced if c.chunk_id >= first]
        node.disk.first = first
        m.retained(first)
        self.stats.retentions += 1

    def _publish(self, node: SimNode) -> None:
        m = node.member
        assert m is not None
        k = self.rng.randint(1, 3)
        payloads = list(range(self.next_payload, self.next_payload + k))
        self.next_payload += k
        epoch, chunk_id = m.append(k)
        chunk = sr.ChunkRef(epoch, chunk_id, chunk_id + k, json.dumps(payloads).encode())
        node.disk.unsynced.append(chunk)
        node.appended.append(chunk)
        self.stats.published += k
        if self.rng.random() < 0.5:
            self._run(node, m.shipments())

    def _detect_writer_down(self) -> None:
        w = self.coord.writer
        if w is None:
            return
        node = self.nodes[w]
        if node.member is None or node.isolated:
            self.down_since = self.now if self.down_since is None else self.down_since
            if self.now - self.down_since >= 6:
                self._coord_apply(sc.WriterDown(self.coord.epoch))
        else:
            self.down_since = None

    def _fault(self) -> None:
        r = self.rng.random()
        members = self.coord.members
        down = [n for n in self.nodes.values() if n.member is None or n.isolated]
        if r < 0.02 and len(down) < (len(members) - 1) // 2 + 1:
            victim = self.nodes[self.rng.choice(members)]
            if victim.member is not None and not victim.isolated:
                if self.rng.random() < 0.6:
                    self.crash(victim)
                else:
                    victim.isolated = True
                    self.stats.isolations += 1
        elif r < 0.05:
            for node in down:
                self.heal(node)
        elif r < 0.06 and self.coord.stable and not self.coord.electing:
            self._change_members()

    def crash(self, node: SimNode) -> None:
        node.member = None
        node.commit_file = node.commit_file[:self.rng.randint(0, len(node.commit_file))]  # never synced
        node.disk.unsynced = []
        node.appended = []
        node.commit_seen = 0
        self.stats.crashes += 1

    def heal(self, node: SimNode) -> None:
        if node.member is None:
            node.member = self._new_member(node)
        node.isolated = False

    def _change_members(self) -> None:
        members = list(self.coord.members)
        others = [n for n in self.nodes if n not in members]
        if others and (len(members) <= 3 or self.rng.random() < 0.5):
            members.append(self.rng.choice(others))
        elif len(members) > 2:
            members.remove(self.rng.choice(members))
        else:
            return
        self._coord_apply(sc.ChangeMembers(tuple(members)))
        self.stats.member_changes += 1

    # -- the end --------------------------------------------------------------------------------------

    def settle(self, max_ticks: int = 3000) -> None:
        """Heal everything, stop faults and publishing losses, and run until every member holds the
        writer's whole log and knows it committed."""
        self.faults, self.drop, self.publishing, self.retention = False, 0.0, False, False
        for node in self.nodes.values():
            self.heal(node)
        for _ in range(max_ticks):
            self.step()
            if self._settled():
                return
        raise StreamViolation(f"seed {self.stats.seed}: not settled after {max_ticks} ticks: "
                              f"{self.coord} {[n.member.status() for n in self.nodes.values() if n.member]}")

    def _settled(self) -> bool:
        w = self.coord.writer
        if w is None:
            return False
        writer = self.nodes[w].member
        assert writer is not None
        end = writer.log.next
        if writer.role is not sr.Role.WRITER or writer.commit != end or writer.synced != end:
            return False
        for name in self.coord.members:
            disk, m = self.nodes[name].disk, self.nodes[name].member
            assert m is not None
            if disk.unsynced or disk.tail().next != end or m.commit != end:
                return False
        return True

    def check_final(self) -> None:
        union: dict[int, sr.ChunkRef] = {}
        for name in self.coord.members:
            disk = self.nodes[name].disk
            for prev, c in zip([None, *disk.synced], disk.synced, strict=False):
                if c.chunk_id != (disk.first if prev is None else prev.next_offset):
                    raise StreamViolation(f"seed {self.stats.seed}: {name} has a gap before {c.chunk_id}")
                if union.setdefault(c.chunk_id, c) != c:
                    raise StreamViolation(f"seed {self.stats.seed}: members differ at {c.chunk_id}")
            held = {c.chunk_id: c.data for c in disk.synced}
            for chunk_id, data in self.confirmed.items():
                if chunk_id >= disk.first and held.get(chunk_id) != data:
                    raise StreamViolation(f"seed {self.stats.seed}: confirmed chunk {chunk_id} {data!r} "
                                          f"lost on {name} (it has {held.get(chunk_id)!r})")
        payloads: list[int] = []
        for _, c in sorted(union.items()):
            records = json.loads(c.data)
            if len(records) != c.next_offset - c.chunk_id:  # every offset holds a published payload
                raise StreamViolation(f"seed {self.stats.seed}: offsets {c.chunk_id}..{c.next_offset - 1} "
                                      f"hold {len(records)} payloads")
            payloads.extend(records)
        if payloads != sorted(set(payloads)):
            raise StreamViolation(f"seed {self.stats.seed}: payloads out of order or twice: {payloads}")


def run_stream_seed(seed: int, ticks: int = 400, n: int = 3, grown: int = 0) -> StreamStats:
    sim = StreamSim(seed, n=n, grown=grown)
    for _ in range(ticks):
        sim.step()
    sim.settle()
    sim.check_final()
    sim.stats.ticks = sim.now
    return sim.stats
