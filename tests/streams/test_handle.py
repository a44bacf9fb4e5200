"""`StreamHandle` (runtime/queue_types/stream/handle.py) on MemoryFS: appends settle after the sync,
deduplication and offset tracking survive a crash, readers start where their spec says and move past
retention."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from hutch.queues.stream import chunk as ck
from hutch.queues.stream.offset_spec import OffsetSpec
from hutch.queues.stream.retention import Retention
from hutch.runtime.clock import ManualClock
from hutch.runtime.queue_types.stream.handle import StreamHandle, StreamOptions, StreamReader
from hutch.storage.errors import StorageError
from hutch.storage.fs import DelegatingFS, FileHandle
from hutch.storage.memfs import MemoryFS

pytestmark = pytest.mark.asyncio
D = "/data/streams/s1"


def records(reader: StreamReader) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    while (c := reader.next_chunk()) is not None:
        out.extend(c.records())
    return out


async def test_append_settles_after_sync_and_readers_see_only_committed() -> None:
    h = await StreamHandle.open(MemoryFS(), D, clock=ManualClock())
    woke: list[int] = []
    h.on_commit(lambda: woke.append(h.committed_chunk_id))
    r = h.reader(OffsetSpec.first())
    a = h.append([b"a", b"b"])
    assert not a.settled.done() and r.next_chunk() is None  # written, not yet synced
    await a.settled
    assert woke == [0] and h.committed_offset == 1 and h.next_offset == 2
    assert records(r) == [(0, b"a"), (1, b"b")]
    await h.close()


async def test_deduplication_and_tracking_survive_a_crash() -> None:
    fs = MemoryFS(seed=3)
    h = await StreamHandle.open(fs, D, clock=ManualClock(), options=StreamOptions(max_segment_size_bytes=256))
    for seq in range(1, 40):
        await h.append([b"m%d" % seq], publisher=b"pub", publishing_ids=[seq]).settled
    await h.store_offset(b"reader-1", 17).settled
    dup = h.append([b"again", b"new"], publisher=b"pub", publishing_ids=[39, 40])
    assert dup.duplicates == [39] and dup.stored == [40]
    await dup.settled
    assert h.segment_count > 2
    fs.crash(torn=True)
    h2 = await StreamHandle.open(fs, D, clock=ManualClock(), options=StreamOptions(max_segment_size_bytes=256))
    assert h2.query_publisher_sequence(b"pub") == 40
    assert h2.query_offset(b"reader-1") == 17
    assert h2.query_publisher_sequence(b"nobody") == 0 and h2.query_offset(b"nobody") is None
    again = h2.append([b"x", b"y"], publisher=b"pub", publishing_ids=[40, 41])
    assert again.duplicates == [40] and again.stored == [41]
    bodies = [b for _, b in records(h2.reader(OffsetSpec.first()))]
    assert bodies == [b"m%d" % i for i in range(1, 40)] + [b"new"]  # tracking chunks are not records
    await h2.close()


async def test_offset_specs() -> None:
    clock = ManualClock(wall_ms=10_000)
    h = await StreamHandle.open(MemoryFS(), D, clock=clock)
    for i in range(5):
        await h.append([b"%d" % i, b"%d'" % i]).settled
        clock.advance(1)
    assert records(h.reader(OffsetSpec.first()))[0] == (0, b"0")
    assert records(h.reader(OffsetSpec.last())) == [(8, b"4"), (9, b"4'")]
    assert records(h.reader(OffsetSpec.next())) == []
    assert records(h.reader(OffsetSpec.offset(3)))[0] == (3, b"1'")  # mid-chunk: from the offset on
    assert records(h.reader(OffsetSpec.offset(999))) == []
    assert records(h.reader(OffsetSpec.timestamp(12_000)))[0] == (4, b"2")
    assert records(h.reader(OffsetSpec.timestamp(99_000))) == []
    r = h.reader(OffsetSpec.next())
    await h.append([b"late"]).settled
    assert records(r) == [(10, b"late")]
    await h.delete()


async def test_retention_moves_readers_to_the_new_first_offset() -> None:
    clock = ManualClock()
    h = await StreamHandle.open(MemoryFS(), D, clock=clock, options=StreamOptions(max_segment_size_bytes=120))
    r = h.reader(OffsetSpec.first())
    await h.append([b"x" * 30]).settled
    assert records(r) == [(0, b"x" * 30)]
    for _ in range(10):
        await h.append([b"y" * 30]).settled
    h.set_retention(Retention(max_bytes=300))
    assert h.first_offset > 1 and h.size_bytes <= 300 + 120
    got = records(r)
    assert got[0][0] == h.first_offset and r.moved == 1
    clock.advance(3600)
    h.set_retention(Retention(max_age_ms=60_000))
    assert h.segment_count == 1
    await h.close()


@pytest.mark.parametrize("seed", range(30))
async def test_after_a_torn_crash_the_log_is_a_prefix_and_tracking_agrees_with_it(seed: int) -> None:
    """Seeded runs: appends with publisher ids and stored offsets, some awaited (synced), then a crash
    that tears unsynced bytes. The recovered records are a prefix of what was written, hold everything
    settled, and each publisher's recovered sequence is exactly the last id among its recovered records
    (the sequence travels in the same chunk as the data)."""
    rng = random.Random(seed)
    fs = MemoryFS(seed=seed)
    opts = StreamOptions(max_segment_size_bytes=rng.choice([200, 600, 50_000]))
    h = await StreamHandle.open(fs, D, clock=ManualClock(), options=opts)
    written: list[bytes] = []
    settled = 0
    next_id = {b"p1": 1, b"p2": 1}
    for _ in range(rng.randint(5, 60)):
        if rng.random() < 0.15:
            a = h.store_offset(b"c", rng.randint(0, 100))
        else:
            pub = rng.choice([b"p1", b"p2"])
            n = rng.randint(1, 3)
            ids = list(range(next_id[pub], next_id[pub] + n))
            next_id[pub] += n
            bodies = [b"%s:%d" % (pub, i) for i in ids]
            a = h.append(bodies, publisher=pub, publishing_ids=ids)
            written.extend(bodies)
        if rng.random() < 0.3:
            await a.settled
            settled = len(written)
    fs.crash(torn=True)
    h2 = await StreamHandle.open(fs, D, clock=ManualClock(), options=opts)
    got = [b for _, b in records(h2.reader(OffsetSpec.first()))]
    assert got == written[:len(got)] and len(got) >= settled
    for pub in (b"p1", b"p2"):
        mine = [int(b.split(b":")[1]) for b in got if b.startswith(pub + b":")]
        assert h2.query_publisher_sequence(pub) == (mine[-1] if mine else 0)
    await h2.close()


async def test_a_follower_takes_the_leaders_chunks_as_they_are() -> None:
    """The replication hook: a leader's reader ships what it wrote (committed or not), a follower with
    auto_commit off appends the same bytes, says what is durable, and commits when told."""
    leader = await StreamHandle.open(MemoryFS(), D, clock=ManualClock())
    follower = await StreamHandle.open(MemoryFS(), D, clock=ManualClock())
    follower.auto_commit = False
    durable: list[int] = []
    all_durable: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_durable(chunk_id: int) -> None:
        durable.append(chunk_id)
        if chunk_id == 2 and not all_durable.done():
            all_durable.set_result(None)

    follower.on_durable.append(on_durable)
    leader.append([b"a", b"b"], publisher=b"p", publishing_ids=[1, 2])
    leader.store_offset(b"c", 1)
    ship = leader.reader(OffsetSpec.first(), committed_only=False, include_tracking=True)
    sent = 0
    while (chunk := ship.next_chunk()) is not None:
        follower.accept_chunk(chunk.raw)
        sent += 1
    assert sent == 2 and follower.next_offset == leader.next_offset == 3
    await asyncio.wait_for(all_durable, 10)  # the follower's group sync ran
    assert durable[-1] == 2
    assert follower.committed_chunk_id == -1 and records(follower.reader(OffsetSpec.first())) == []
    follower.commit(2)
    assert records(follower.reader(OffsetSpec.first())) == [(0, b"a"), (1, b"b")]
    assert follower.query_publisher_sequence(b"p") == 2 and follower.query_offset(b"c") == 1
    with pytest.raises(ValueError):
        follower.accept_chunk(chunk_bytes_out_of_order(leader))
    await leader.close()
    await follower.close()


def chunk_bytes_out_of_order(leader: StreamHandle) -> bytes:
    """The leader's first chunk again: its id is behind the follower's next offset."""
    chunk = leader.reader(OffsetSpec.first(), committed_only=False).next_chunk()
    assert chunk is not None
    return chunk.raw


async def test_syncs_run_on_the_writer_thread_and_appends_made_meanwhile_join_one_sync() -> None:
    """The fdatasync runs on the stream's writer thread, never the loop's: the loop goes on while it
    waits for the disk, and the appends made meanwhile are synced together by the next one."""
    fs = GatedFS()
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    fs.paced = True
    syncs = h.syncs
    a = h.append([b"a"])
    await fs.entered(1)  # the sync of "a" waits for the disk (its permit), on the writer thread
    b = h.append([b"b"])
    await asyncio.sleep(0)  # (the loop turn's end: the sync of "b" is asked for)
    c = h.append([b"c"])
    await asyncio.sleep(0)
    assert not a.settled.done() and not b.settled.done()
    fs.allow(100)
    await asyncio.wait_for(asyncio.gather(a.settled, b.settled, c.settled), 10)
    assert h.syncs == syncs + 2 and h.committed_offset == 2  # "b" and "c": one sync
    assert fs.sync_threads and threading.get_ident() not in fs.sync_threads  # never on the loop's thread
    await h.close()


async def test_an_idle_writer_thread_ends_and_the_next_sync_starts_another(monkeypatch: pytest.MonkeyPatch) -> None:
    from hutch.runtime.queue_types.stream import writer as writer_mod

    monkeypatch.setattr(writer_mod, "IDLE_EXIT_S", 0.01)
    h = await StreamHandle.open(MemoryFS(), D, clock=ManualClock())
    await h.append([b"a"]).settled
    writer = h._writer
    assert writer is not None and writer._thread is not None and writer.started == 1
    thread = writer._thread
    await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)
    assert not thread.is_alive()  # an idle stream holds no thread
    await asyncio.wait_for(h.append([b"b"]).settled, 10)
    assert writer.started == 2 and h.committed_offset == 1
    last = writer._thread
    await h.close()
    assert last is not None
    await asyncio.get_running_loop().run_in_executor(None, last.join, 10)
    assert not last.is_alive()  # closing the stream ends its writer thread


class _GatedHandle:
    """A file handle whose fdatasync takes a permit from its file system first (a disk the test paces)."""

    def __init__(self, fs: GatedFS, inner: FileHandle) -> None:
        self.path = inner.path
        self._fs = fs
        self._inner = inner

    def write(self, data: bytes) -> None:
        self._inner.write(data)

    def sync(self) -> None:
        if self._fs.paced:
            self._fs.entering()
            assert self._fs.permits.acquire(timeout=10), "the test gave no permit"
        self._inner.sync()

    def close(self) -> None:
        self._inner.close()


class GatedFS(DelegatingFS):
    """MemoryFS whose fdatasyncs, once `paced`, wait for `allow(n)` (each sync of a handle takes one permit)."""

    def __init__(self) -> None:
        super().__init__(MemoryFS())
        self.paced = False
        self.permits = threading.Semaphore(0)
        self.syncs_entered = 0
        self.sync_threads: list[int] = []  # the thread of each paced sync
        self._entered = threading.Condition()

    def open_append(self, path: str) -> FileHandle:
        return _GatedHandle(self, self.inner.open_append(path))

    def entering(self) -> None:
        with self._entered:
            self.syncs_entered += 1
            self.sync_threads.append(threading.get_ident())
            self._entered.notify_all()

    def allow(self, n: int) -> None:
        for _ in range(n):
            self.permits.release()

    async def entered(self, n: int) -> None:
        """Return once `n` syncs have begun (each waits for its permit)."""
        def wait() -> bool:
            with self._entered:
                return self._entered.wait_for(lambda: self.syncs_entered >= n, timeout=10)
        assert await asyncio.get_running_loop().run_in_executor(None, wait), f"{n} syncs never began"


@pytest.mark.parametrize("second", ["close", "delete"])
async def test_a_close_or_delete_waits_for_the_close_in_flight(second: str) -> None:
    """close() syncs what the last group sync did not cover, in the executor; a second close, or a delete
    (a stream deleted while the node stops), must wait for that sync, not close or delete the files
    under it."""
    fs = GatedFS()
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    fs.paced = True
    fs.allow(2)
    await h.append([b"a"]).settled
    h.append([b"b"])
    await fs.entered(3)  # the group sync of "b" is on the writer thread, waiting for its permit
    h.append([b"c"])  # written while that sync runs: close() must sync it itself
    first = asyncio.create_task(h.close())
    await asyncio.sleep(0)
    fs.allow(2)  # the group sync ends; close's own sync begins and waits
    await fs.entered(5)
    other = asyncio.create_task(h.close() if second == "close" else h.delete())
    await asyncio.wait([other], timeout=0.5)  # time for a delete that did not wait to run
    assert not other.done() and not first.done()
    assert fs.exists(D)
    fs.allow(100)
    await asyncio.wait_for(asyncio.gather(first, other), 10)  # neither fails (a sync on a closed file would)
    assert h.failed is None and h.committed_offset == 2
    assert fs.exists(D) == (second == "close")


async def test_a_delete_waits_for_the_group_sync_in_flight() -> None:
    fs = GatedFS()
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    fs.paced = True
    appended = h.append([b"a"])
    await fs.entered(1)  # the group sync runs on the writer thread
    gone = asyncio.create_task(h.delete())
    await asyncio.wait([gone], timeout=0.5)
    assert not gone.done() and fs.exists(D)
    fs.allow(100)
    await asyncio.wait_for(gone, 10)
    assert not fs.exists(D) and h.failed is None
    with pytest.raises(StorageError):
        await appended.settled


@pytest.mark.parametrize("follower_segment_bytes", [256, 400, 10_000])
async def test_a_followers_segments_start_with_the_leaders_tracking_snapshots(follower_segment_bytes: int) -> None:
    """Tracking (deduplication, stored offsets) is read back at start from the last segment alone, so every
    segment must begin with a tracking snapshot while there is tracking. The leader writes one after each
    roll; a follower takes that chunk as its roll point, whatever its own segment size, and so recovers the
    same tracking after a restart."""
    opts = StreamOptions(max_segment_size_bytes=256)
    leader = await StreamHandle.open(MemoryFS(), D, clock=ManualClock(), options=opts)
    ffs = MemoryFS()
    follower = await StreamHandle.open(ffs, D, clock=ManualClock(),
                                       options=StreamOptions(max_segment_size_bytes=follower_segment_bytes))
    follower.auto_commit = False
    for seq in range(1, 30):
        leader.append([b"m%d" % seq + b"x" * (seq % 7) * 10], publisher=b"pub", publishing_ids=[seq])
        if seq == 12:
            leader.store_offset(b"reader", 5)
    ship = leader.reader(OffsetSpec.first(), committed_only=False, include_tracking=True)
    while (chunk := ship.next_chunk()) is not None:
        follower.accept_chunk(chunk.raw)
    assert leader.segment_count > 3 and follower.next_offset == leader.next_offset
    follower.commit(follower.last_chunk_id)
    await follower.close()
    again = await StreamHandle.open(ffs, D, clock=ManualClock(),
                                    options=StreamOptions(max_segment_size_bytes=follower_segment_bytes))
    assert again.query_publisher_sequence(b"pub") == 29 and again.query_offset(b"reader") == 5
    slog = again.log
    for seg in slog.segments[1:]:  # every segment after the first opens with the leader's snapshot
        assert slog.index_record(seg, 0).chunk_type == ck.TRACKING_SNAPSHOT
    await again.close()
    await leader.close()


async def test_a_sync_fdatasyncs_the_segment_and_its_index_at_the_same_time() -> None:
    """Both files' fdatasyncs are under way together (they share the file system's journal commit)."""
    fs = GatedFS()
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    fs.paced = True
    a = h.append([b"a"])
    await fs.entered(2)  # the segment's and the index's syncs both began, neither let through yet
    assert not a.settled.done() and len(set(fs.sync_threads)) == 2
    fs.allow(2)
    await asyncio.wait_for(a.settled, 10)
    await h.close()


async def test_sync_together_raises_a_failure_only_once_every_sync_ended() -> None:
    from hutch.runtime.queue_types.stream.writer import sync_together

    ended: list[str] = []
    release = threading.Event()

    class Slow:
        def sync(self) -> None:
            assert release.wait(10)
            ended.append("slow")

    class Broken:
        def sync(self) -> None:
            release.set()
            raise StorageError("sync", "/x", detail="disk gone")

    with pytest.raises(StorageError):
        sync_together([Broken(), Slow()])  # type: ignore[list-item]
    assert ended == ["slow"]


async def test_files_of_the_earlier_format_open_and_carry_on() -> None:
    # before: a stream of one node stamped epoch 0 and wrote the chunk id into its trailers (32 bytes
    # for "test-reference"); now it stamps epoch 1 and writes osiris's 24 bytes. Old files read as they did.
    import hutch.queues.stream.tracking as trk
    fs = MemoryFS(seed=5)
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    for i in range(3):
        old = ck.encode([b"old%d" % i], timestamp=1, epoch=0, chunk_id=i,
                        trailer=trk.sequence_block(b"test-reference", i, i + 1))
        h.accept_chunk(old)
    await h.close()
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    assert h.query_publisher_sequence(b"test-reference") == 3
    dup = h.append([b"again", b"new"], publisher=b"test-reference", publishing_ids=[3, 4])
    assert dup.duplicates == [3] and dup.stored == [4]
    await dup.settled
    r = h.reader(OffsetSpec.offset(3))
    chunk = r.next_chunk()
    assert chunk is not None and chunk.header.epoch == 1 and chunk.header.trailer_size == 24
    await h.close()
    h = await StreamHandle.open(fs, D, clock=ManualClock())
    assert h.query_publisher_sequence(b"test-reference") == 4
    assert records(h.reader(OffsetSpec.first())) == [(0, b"old0"), (1, b"old1"), (2, b"old2"), (3, b"new")]
    await h.close()
