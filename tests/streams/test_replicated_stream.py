"""`ReplicatedStream` (runtime/queue_types/stream_replication/member.py): three members of one stream,
each over its own `StreamHandle` on its own MemoryFS, linked in memory, with the coordinator as the
linearizable object its Raft group makes of it. Publishes settle once a majority has the chunk on disk;
members hold the writer's chunks byte for byte; a member that was down catches up from the writer's
files; a new writer after the old one died, and the old one's unreplicated tail cut when it returns."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.queues.stream import chunk as ck
from hutch.queues.stream.offset_spec import OffsetSpec
from hutch.queues.stream.retention import Retention
from hutch.runtime.clock import ManualClock
from hutch.runtime.queue_types.stream.handle import StreamOptions
from hutch.runtime.queue_types.stream_replication import member as member_module
from hutch.runtime.queue_types.stream_replication.member import NotWriter, ReplicatedStream
from hutch.storage.errors import StorageError
from hutch.storage.memfs import MemoryFS

pytestmark = pytest.mark.asyncio
D = "/data/streams/s1"
NAMES = ("n1", "n2", "n3")


class Cluster:
    """The members, the in-memory links between them (a member can be cut off), the coordinator."""

    def __init__(self) -> None:
        self.fs = {n: MemoryFS(seed=i) for i, n in enumerate(NAMES)}
        self.members: dict[str, ReplicatedStream] = {}
        self.cut: set[str] = set()
        self.coord = sc.apply(sc.NONE, sc.Declare(NAMES, "n1"))
        self.incarnations = dict.fromkeys(NAMES, 0)
        self.clock = ManualClock()

    def link(self, me: str) -> Link:
        return Link(self, me)

    async def start(self, name: str) -> ReplicatedStream:
        self.incarnations[name] += 1
        rs = await ReplicatedStream.open(
            name, self.fs[name], D, self.link(name), clock=self.clock, fenced=self.coord.epoch,
            session_base=self.incarnations[name] << 32, tick_s=0.01,
            options=StreamOptions(max_segment_size_bytes=2048))
        self.members[name] = rs
        rs.observe(self.coord.view())
        return rs

    async def stop(self, name: str, crash: bool = False) -> None:
        rs = self.members.pop(name)
        if crash:
            rs.closed = True
            if rs._timer is not None:
                rs._timer.cancel()
            self.fs[name].crash()
        else:
            await rs.close()

    def apply(self, cmd: sc.Command) -> None:
        before = self.coord
        self.coord = sc.apply(self.coord, cmd)
        if self.coord != before:
            for name, rs in self.members.items():
                if name not in self.cut:
                    asyncio.get_running_loop().call_soon(rs.observe, self.coord.view())

    def writer(self) -> ReplicatedStream:
        assert self.coord.writer is not None
        return self.members[self.coord.writer]


class Link:
    def __init__(self, cluster: Cluster, me: str) -> None:
        self.cluster, self.me = cluster, me

    def send(self, peer: str, message: sr.Message) -> None:
        c = self.cluster
        if self.me in c.cut or peer in c.cut or peer not in c.members:
            return
        target = c.members[peer]
        asyncio.get_running_loop().call_soon(target.receive, message)

    def to_coordinator(self, effect: sr.Report | sr.Reelect | sr.Stable | sr.Begin) -> None:
        if self.me in self.cluster.cut:
            return
        cmd = sc.command_for(effect)
        asyncio.get_running_loop().call_soon(self.cluster.apply, cmd)


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not cond():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def chunks(rs: ReplicatedStream, committed_only: bool = False) -> list[bytes]:
    r = rs.handle.reader(OffsetSpec.first(), committed_only=committed_only, include_tracking=True)
    out = []
    while (c := r.next_chunk()) is not None:
        out.append(c.raw)
    return out


def records(rs: ReplicatedStream) -> list[bytes]:
    r = rs.handle.reader(OffsetSpec.first())
    out: list[bytes] = []
    while (c := r.next_chunk()) is not None:
        out.extend(rec for _, rec in c.records())
    return out


async def started(cluster: Cluster) -> None:
    for n in NAMES:
        await cluster.start(n)
    await until(lambda: cluster.coord.stable and cluster.coord.writer is not None
                and cluster.writer().member.stable, "a stable writer")


async def same_logs(cluster: Cluster) -> None:
    def same() -> bool:
        members = list(cluster.members.values())
        if any(m.reopening for m in members):
            return False  # a cut under way: the old handle's index still names what the files lost
        try:
            ref = chunks(cluster.writer())
            return all(chunks(m) == ref and m.member.commit == cluster.writer().member.commit for m in members)
        except StorageError:  # a cut began while reading: look again
            return False
    await until(same, "every member holding the writer's log")


async def test_publishes_settle_on_a_majority_and_members_hold_the_same_chunks() -> None:
    c = Cluster()
    await started(c)
    w = c.writer()
    with pytest.raises(NotWriter):
        c.members["n2"].publish([b"x"])
    settled = [w.publish([b"m%d" % i, b"n%d" % i], publisher=b"p", publishing_ids=[2 * i + 1, 2 * i + 2])
               for i in range(50)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in settled)), 20)
    assert settled[0].first_offset == 0          # a fresh stream's first message is at 0, as RabbitMQ's
    await same_logs(c)
    want = [b"%s%d" % (p, i) for i in range(50) for p in (b"m", b"n")]
    for m in c.members.values():
        assert records(m) == want
        assert m.handle.query_publisher_sequence(b"p") == 100
    assert len(w.handle.log.segments) > 1   # the segments rolled, on every member alike
    for m in c.members.values():
        await m.close()


async def test_a_writer_change_on_a_caught_up_stream_leaves_no_gap() -> None:
    c = Cluster()
    await started(c)
    done = [c.writer().publish([b"a%d" % i]) for i in range(10)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in done)), 20)
    await same_logs(c)                            # every member knows the whole log committed
    epoch = c.coord.epoch
    c.apply(sc.WriterDown(epoch))                 # an election: whoever wins writes no marker
    await until(lambda: c.coord.epoch > epoch and c.coord.writer is not None and c.coord.stable
                and c.writer().member.stable, "a new stable writer")
    after = c.writer().publish([b"b0"])
    await asyncio.wait_for(after.settled, 20)
    assert after.first_offset == 10               # no offset taken by the epoch change
    await same_logs(c)
    for m in c.members.values():
        r = m.handle.reader(OffsetSpec.first())
        got = []
        while (ch := r.next_chunk()) is not None:
            got.extend(ch.records())
        assert got == [*((i, b"a%d" % i) for i in range(10)), (10, b"b0")]
    for m in c.members.values():
        await m.close()


@pytest.mark.parametrize("commit_files", [True, False])
async def test_a_restart_of_every_member_leaves_no_gap(commit_files: bool) -> None:
    c = Cluster()
    await started(c)
    done = [c.writer().publish([b"a%d" % i]) for i in range(10)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in done)), 20)
    await same_logs(c)
    for n in NAMES:
        await c.stop(n)
        if not commit_files:  # what a member knew is gone: the next writer carries the log
            c.fs[n].delete(f"{D}/commit")
    for n in NAMES:
        await c.start(n)   # the writer of epoch 1 restarted: it asks for an election
    await until(lambda: c.coord.epoch > 1 and c.coord.writer is not None and c.coord.stable
                and c.writer().member.stable, "a new stable writer")
    assert c.writer().member.carry is not commit_files
    # idle: no publish, and no chunk written; the old chunks are committed (by the commit file, or by
    # the writer's recorded start) and every member's readers see all ten
    await until(lambda: all(len(records(m)) == 10 for m in c.members.values()), "the old chunks readable")
    assert all(len(chunks(m)) == 10 for m in c.members.values())
    after = c.writer().publish([b"b0"])
    await asyncio.wait_for(after.settled, 20)
    assert after.first_offset == 10   # no offset taken by the writer change
    await same_logs(c)
    for m in c.members.values():
        r = m.handle.reader(OffsetSpec.first())
        offsets = [o for chunk in iter(r.next_chunk, None) for o, _ in chunk.records()]
        assert offsets == list(range(11))
    for m in c.members.values():
        await m.close()


async def test_files_with_a_marker_of_the_code_before_open_and_read() -> None:
    # the code before recorded starts wrote a 1-record tracking snapshot of its epoch for an idle writer
    # carrying older chunks; such files open, carry on and read as they did (the marker's offset stays)
    c = Cluster()
    await started(c)
    done = [c.writer().publish([b"a%d" % i]) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in done)), 20)
    w = c.writer()
    before = w.handle.next_offset
    w.handle.accept_chunk(ck.encode([w.handle.tracking.snapshot()], chunk_type=ck.TRACKING_SNAPSHOT,
                                    timestamp=c.clock.wall_ms(), epoch=w.handle.epoch, chunk_id=before))
    w._wrote(before)
    w._flush()
    await same_logs(c)
    for n in NAMES:
        await c.stop(n)
        c.fs[n].delete(f"{D}/commit")
    for n in NAMES:
        await c.start(n)
    await until(lambda: c.coord.epoch > 1 and c.coord.writer is not None and c.writer().member.stable,
                "a new stable writer")
    after = c.writer().publish([b"b0"])
    await asyncio.wait_for(after.settled, 20)
    assert after.first_offset == 6
    await same_logs(c)
    for m in c.members.values():
        r = m.handle.reader(OffsetSpec.first())
        assert [(o, rec) for chunk in iter(r.next_chunk, None) for o, rec in chunk.records()] == [
            *((i, b"a%d" % i) for i in range(5)), (6, b"b0")]
        await m.close()


async def test_no_majority_no_settlement_then_a_member_catches_up() -> None:
    c = Cluster()
    await started(c)
    w = c.writer()
    await c.stop("n3")
    one = w.publish([b"with n2"])
    await asyncio.wait_for(one.settled, 20)       # n1 + n2 are a majority
    c.cut.add("n2")
    two = w.publish([b"alone"])
    for _ in range(30):
        await asyncio.sleep(0.01)
    assert not two.settled.done()                 # one copy of three is not a majority
    c.cut.discard("n2")
    await asyncio.wait_for(two.settled, 20)
    more = [w.publish([b"b%d" % i]) for i in range(40)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in more)), 20)
    await c.start("n3")                           # down while 41 chunks were written: catches up
    await same_logs(c)
    assert records(c.members["n3"]) == [b"with n2", b"alone", *(b"b%d" % i for i in range(40))]
    for m in c.members.values():
        await m.close()


async def test_a_new_writer_after_a_crash_and_the_old_tail_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    cuts: list[tuple[str, int]] = []
    real_truncate = member_module.truncate_files

    def truncate(fs: MemoryFS, directory: str, next_offset: int) -> int:
        cuts.append((directory, next_offset))
        return real_truncate(fs, directory, next_offset)
    monkeypatch.setattr(member_module, "truncate_files", truncate)
    c = Cluster()
    await started(c)
    w = c.writer()
    done = [w.publish([b"a%d" % i]) for i in range(10)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in done)), 20)
    c.cut.add("n1")                               # the writer alone writes a tail nobody else gets
    lost = w.publish([b"unconfirmed"])
    await until(lambda: w.member.synced == w.handle.next_offset, "the lone write synced")
    c.apply(sc.WriterDown(c.coord.epoch))         # the failure detector's verdict
    await until(lambda: c.coord.writer in ("n2", "n3") and c.coord.stable, "a new stable writer")
    assert not lost.settled.done()
    w2 = c.writer()
    after = [w2.publish([b"b%d" % i]) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in after)), 20)
    # the old writer returns as a new incarnation: its lone chunk is cut, it takes the new writer's log
    await c.stop("n1", crash=True)                # kill -9: what was not synced is gone too
    c.cut.discard("n1")
    await c.start("n1")
    await same_logs(c)
    assert cuts and cuts[-1][1] == lost.first_offset       # n1's lone chunk was cut off its files
    want = [*(b"a%d" % i for i in range(10)), *(b"b%d" % i for i in range(5))]
    for m in c.members.values():
        assert records(m) == want
    for m in c.members.values():
        await m.close()


async def test_chunks_that_do_not_verify_are_dropped_and_shipped_again(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster()
    await started(c)
    w = c.writer()
    flips = [0]
    real_send = Link.send

    def corrupting_send(self: Link, peer: str, message: sr.Message) -> None:
        if isinstance(message, sr.Chunks) and flips[0] < 3:  # the first shipments arrive damaged
            flips[0] += 1
            bad = message.chunks[0]
            raw = bytearray(bad.data)
            raw[-1] ^= 0xFF
            message = message._replace(chunks=(bad._replace(data=bytes(raw)), *message.chunks[1:]))
        real_send(self, peer, message)
    monkeypatch.setattr(Link, "send", corrupting_send)
    done = [w.publish([b"c%d" % i]) for i in range(10)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in done)), 20)
    await same_logs(c)
    assert flips[0] == 3
    for m in c.members.values():
        assert records(m) == [b"c%d" % i for i in range(10)]
        await m.close()


async def test_a_member_whose_disk_fails_stops_and_a_failed_writer_is_replaced(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster()
    await started(c)
    w = c.writer()
    broken = c.members["n3"]

    def accept_fails(raw: bytes) -> None:
        raise StorageError("append", D, detail="no space left on device")
    monkeypatch.setattr(broken.handle, "accept_chunk", accept_fails)
    done = [w.publish([b"d%d" % i]) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in done)), 20)  # n1 + n2
    assert broken.closed
    # now the writer's own disk fails: it asks for an election and n2 takes over
    def append_fails(*args: object, **kwargs: object) -> None:
        raise StorageError("append", D, detail="no space left on device")
    monkeypatch.setattr(w.handle, "append", append_fails)
    with pytest.raises(StorageError):
        w.publish([b"lost"])
    assert w.closed
    del c.members["n1"], c.members["n3"]
    await c.start("n3")    # the broken member restarted (its disk fine again)
    await until(lambda: c.coord.writer == "n2" and c.coord.stable, "n2 writing")
    more = c.writer().publish([b"after"])
    await asyncio.wait_for(more.settled, 20)
    await until(lambda: records(c.members["n3"]) == [*(b"d%d" % i for i in range(5)), b"after"],
                "n3 caught up")
    for m in c.members.values():
        await m.close()
    await broken.close()
    await w.close()


async def test_retention_removes_only_committed_segments_and_a_member_behind_it_is_reset() -> None:
    """Retention on a replicated member (the handle's `retention_floor` / `on_retained` hooks): a writer
    whose replicas cannot acknowledge keeps every segment above the commit point; once committed, the
    oldest segments go on the writer, its machine learns the new first offset, and a member that was
    down past them starts again from the writer's first offset (no shipment from a deleted segment)."""
    c = Cluster()
    await started(c)
    w = c.writer()
    await c.stop("n3")
    c.cut.add("n2")
    pending = [w.publish([b"x" * 300]) for _ in range(30)]  # ~ 5 segments of 2 KiB, none committed
    await until(lambda: w.member.synced == w.handle.next_offset, "the lone writes synced")
    w.handle.set_retention(Retention(max_bytes=2048, max_age_ms=None))
    assert w.handle.first_offset == 0 and w.member.log.first == 0  # nothing committed: nothing goes
    c.cut.discard("n2")
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in pending)), 20)
    w.handle.apply_retention()
    assert w.handle.first_offset > 0
    assert w.member.log.first == w.handle.first_offset
    assert w.handle.first_offset <= w.member.commit
    more = [w.publish([b"y%d" % i]) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*(a.settled for a in more)), 20)
    await c.start("n3")  # behind the writer's first offset: reset to it, then caught up
    await until(lambda: c.members["n3"].handle.next_offset == w.handle.next_offset, "n3 caught up")
    assert c.members["n3"].handle.first_offset == w.handle.first_offset
    # a replica reads what the writer told it is committed, which may come after the chunks themselves
    await until(lambda: records(c.members["n3"])[-5:] == [b"y%d" % i for i in range(5)], "n3 committed them")
    for m in c.members.values():
        await m.close()
