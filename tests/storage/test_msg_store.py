"""The message store: reads and writes, refcounts, rollover, garbage collection, compaction, recovery."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hutch.storage import records
from hutch.storage.appendfile import FILE_HEADER_BYTES, ManualSink, read_seed, scan_file
from hutch.storage.errors import CorruptRecord
from hutch.storage.memfs import MemoryFS
from hutch.storage.msg_store import ENTRY_HEAD, STORE_RECORD_TYPE, MessageStore, file_name

DIR = "/data/store"
LIMIT = 4096


def path(number: int) -> str:
    return f"{DIR}/{file_name(number)}"


def scan_store_file(data: bytes) -> records.ScanResult:
    """The records of a store file after its header (read with the file's seed)."""
    return scan_file(data, path(1), STORE_RECORD_TYPE)[1]


def body(n: int, size: int = 100) -> bytes:
    """A recognisable payload: ``m<n>-`` repeated to ``size`` bytes."""
    return (f"m{n}-".encode() * size)[:size]


def open_store(fs: MemoryFS, limit: int = LIMIT,
               refs: dict[int, int] | None = None) -> tuple[MessageStore, ManualSink]:
    """A recovered store; with `refs`, also given its reference counts."""
    sink = ManualSink()
    store = MessageStore(fs, DIR, sink, file_size_limit=limit)
    store.recover()
    if refs is not None:
        store.set_refs(refs)
    return store, sink


def new_store(limit: int = LIMIT) -> tuple[MemoryFS, MessageStore, ManualSink]:
    fs = MemoryFS()
    store, sink = open_store(fs, limit, {})
    return fs, store, sink


class CountingFS(MemoryFS):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, int, int | None]] = []

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        self.reads.append((path, offset, length))
        return super().read(path, offset, length)


# -- writing and reading -----------------------------------------------------------------------------------


def test_write_read_round_trip_buffered_then_flushed() -> None:
    fs, store, sink = new_store()
    ids = [store.write(body(n)) for n in range(3)]
    empty = store.write(b"")
    assert ids + [empty] == [1, 2, 3, 4]  # 0 means "no store id" to the queue index
    assert fs.size(path(1)) == 0  # created (and its name made durable) but nothing flushed
    assert [store.read(i) for i in ids] == [body(n) for n in range(3)]
    assert store.read(empty) == b""
    sink.commit()
    assert fs.size(path(1)) > 0 and fs.unsynced_bytes(path(1)) == 0
    assert [store.read(i) for i in ids] == [body(n) for n in range(3)]
    assert store.contains(2) and not store.contains(99)
    with pytest.raises(KeyError):
        store.read(99)
    assert (store.message_count, store.file_count) == (4, 1)
    assert store.live_bytes == 3 * (100 + 16) + 16


def test_read_is_one_positioned_read_of_the_entry() -> None:
    fs = CountingFS()
    store, sink = open_store(fs, refs={})
    msg = store.write(body(1, 1000))
    sink.commit()
    fs.reads.clear()
    assert store.read(msg) == body(1, 1000)
    assert fs.reads == [(path(1), FILE_HEADER_BYTES + records.HEADER_BYTES + 4, ENTRY_HEAD.size + 1000)]


def test_entry_offsets_match_the_file_layout() -> None:
    fs, store, sink = new_store()
    a = store.write(b"alpha")
    sink.commit()
    b = store.write(b"beta")
    c = store.write(b"gamma")
    sink.commit()
    data = fs.read(path(1))
    assert read_seed(data) is not None  # the file starts with its header
    scanned = scan_store_file(data)
    assert scanned.torn_tail is None and scanned.valid_length == len(data)
    assert scanned.records[0].offset == FILE_HEADER_BYTES
    assert [len(r.payload) for r in scanned.records] == [4 + 12 + 5, 2 * 4 + 2 * 12 + 4 + 5]
    for msg, payload in ((a, b"alpha"), (b, b"beta"), (c, b"gamma")):
        assert payload in data
        assert store.read(msg) == payload


def test_rollover_at_the_file_size_limit() -> None:
    fs, store, sink = new_store(limit=4096)
    ids = []
    for n in range(100):
        ids.append(store.write(body(n, 200)))
        if n % 10 == 9:
            sink.commit()
    assert ids == list(range(1, 101))
    assert store.file_count > 4
    assert fs.list_dir(DIR) == [file_name(i) for i in range(1, store.file_count + 1)]
    for i in range(1, store.file_count):
        assert 4096 <= fs.size(path(i)) < 4096 + 250 + records.HEADER_BYTES
    assert [store.read(i) for i in ids] == [body(n, 200) for n in range(100)]
    assert store.bytes_on_disk == sum(fs.size(path(i)) for i in range(1, store.file_count + 1))


def test_a_message_larger_than_a_file_goes_in_one_entry() -> None:
    fs, store, sink = new_store(limit=1024)
    small = store.write(b"x")
    big = store.write(body(7, 10_000))
    after = store.write(b"y")
    sink.commit()
    assert (store.read(small), store.read(big), store.read(after)) == (b"x", body(7, 10_000), b"y")
    store.close()
    store, _ = open_store(fs, 1024, {small: 1, big: 1, after: 1})
    assert store.read(big) == body(7, 10_000)


def test_write_needs_recover_and_an_open_store() -> None:
    fs = MemoryFS()
    store = MessageStore(fs, DIR, ManualSink())
    with pytest.raises(RuntimeError, match="recover"):
        store.write(b"x")
    store.recover()
    with pytest.raises(RuntimeError):
        store.recover()
    with pytest.raises(ValueError):
        store.write(b"x", refs=0)
    store.write(b"x")
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.write(b"y")


# -- references, garbage, compaction -----------------------------------------------------------------------


def test_refcounts() -> None:
    _, store, _ = new_store()
    msg = store.write(b"shared", refs=3)
    store.incref(msg)
    assert store.refcount(msg) == 4
    store.decref(msg, 2)
    store.decref(msg)
    assert store.contains(msg) and store.read(msg) == b"shared"
    with pytest.raises(ValueError):
        store.decref(msg, 2)  # more than it has: nothing changes
    store.decref(msg)
    assert not store.contains(msg)
    with pytest.raises(KeyError):
        store.read(msg)
    with pytest.raises(KeyError):
        store.decref(msg)
    with pytest.raises(KeyError):
        store.incref(msg)
    assert store.message_count == 0 and store.live_bytes == 0


def fill_two_files(store: MessageStore, sink: ManualSink) -> tuple[list[int], list[int]]:
    """Ten 300-byte messages in file 1 (LIMIT 4096), then one in file 2 (the current file); committed."""
    first = [store.write(body(n, 300)) for n in range(10)]
    assert store.file_count == 1
    while store.file_count == 1:
        first.append(store.write(body(len(first), 300)))
    second = [first.pop()]
    sink.commit()
    return first, second


def test_the_current_file_is_never_deleted() -> None:
    fs, store, sink = new_store()
    ids = [store.write(body(n)) for n in range(3)]
    sink.commit()
    for msg in ids:
        store.decref(msg)
    assert store.message_count == 0 and store.live_bytes == 0
    assert store.file_numbers == [1] and fs.exists(path(1))
    assert store.write(b"more") == 4


def test_a_file_whose_messages_all_die_is_deleted_at_once() -> None:
    fs, store, sink = new_store()
    a = store.write(body(1, 3000), refs=2)
    b = store.write(body(2, 3000))  # file 1 is now past the limit
    c = store.write(b"in file 2")
    sink.commit()
    assert store.file_numbers == [1, 2]
    store.decref(b)  # 3000 of 6000+ entry bytes left: at least half, not compacted
    store.decref(a)
    assert store.compactions == 0 and fs.exists(path(1))
    store.decref(a)
    assert store.file_numbers == [2] and not fs.exists(path(1))
    assert store.compactions == 0
    assert store.read(c) == b"in file 2"


def test_compaction_below_half_live() -> None:
    fs, store, sink = new_store()
    first, second = fill_two_files(store, sink)
    n = len(first)
    keep = first[n // 2 + 1:]
    for msg in first[:n // 2]:
        store.decref(msg)
    assert store.compactions == 0  # exactly half (or more) live
    store.decref(first[n // 2])
    assert store.compactions == 1
    # Copies are buffered in the current file; the old file stays until they are synced.
    assert fs.exists(path(1))
    assert [store.read(m) for m in keep] == [body(first.index(m), 300) for m in keep]
    size_before = fs.size(path(2))
    sink.commit()
    assert not fs.exists(path(1))
    assert fs.size(path(2)) > size_before
    assert [store.read(m) for m in keep] == [body(first.index(m), 300) for m in keep]
    assert store.read(second[0]) == body(len(first), 300)
    # A moved message now counts against its new file; the old file is not compacted twice.
    for msg in keep:
        store.decref(msg)
    assert store.compactions == 1
    assert store.file_numbers[-1] >= 2 and 1 not in store.file_numbers


def test_a_rolled_over_file_is_looked_at_once_flushed() -> None:
    fs, store, sink = new_store()
    msg = 0
    while True:
        msg = store.write(body(msg, 300))
        if store.file_count > 1:
            break  # rolled over: file 1 is no longer current but still has buffered bytes
        store.decref(msg)  # all dead in the current file, nothing flushed yet
    assert store.file_numbers == [1, 2] and fs.exists(path(1))
    sink.commit()  # flushed, then checked: no live message left
    assert not fs.exists(path(1))
    assert store.file_numbers == [2]


# -- recovery ---------------------------------------------------------------------------------------------


def test_recovery_after_a_clean_shutdown() -> None:
    fs, store, sink = new_store()
    ids = [store.write(body(n, 300), refs=2 if n % 2 else 1) for n in range(30)]
    sink.commit()
    store.close()
    files_before = fs.list_dir(DIR)

    store, sink = open_store(fs)
    assert store.recovery.files == len(files_before)
    assert store.recovery.messages == 30
    assert [store.read(m) for m in ids] == [body(n, 300) for n in range(30)]  # readable before set_refs
    store.set_refs({m: 2 if n % 2 else 1 for n, m in enumerate(ids)})
    assert [store.refcount(m) for m in ids[:2]] == [1, 2]
    new = store.write(b"after restart")
    assert new == 31
    assert int(fs.list_dir(DIR)[-1][:8]) == len(files_before) + 1  # a new file after the old ones
    sink.commit()
    store.close()
    store, _ = open_store(fs, refs={**{m: 1 for m in ids}, new: 1})
    assert store.read(new) == b"after restart"
    assert store.next_id == 32


def test_unreferenced_messages_are_dropped_and_their_files_deleted() -> None:
    fs, store, sink = new_store()
    ids = [store.write(body(n, 300)) for n in range(40)]
    sink.commit()
    store.close()
    nfiles = len(fs.list_dir(DIR))
    assert nfiles >= 3
    keep = ids[-3:]
    store, sink = open_store(fs)
    assert store.file_count == nfiles
    store.set_refs({m: 1 for m in keep} | {10_000: 1})  # an id the store lost is ignored
    assert store.recovery.garbage_messages == 37
    assert store.message_count == 3 and not store.contains(10_000)
    assert store.recovery.deleted_files >= nfiles - 2
    assert [store.read(m) for m in keep] == [body(n, 300) for n in range(37, 40)]
    assert store.write(b"next") == 10_001  # never an id a queue index still names
    sink.commit()
    fs.crash(torn=False)  # the deletions were made durable
    assert len(fs.list_dir(DIR)) <= 3


def test_recovered_files_wait_for_set_refs() -> None:
    fs, store, sink = new_store()
    old = [store.write(body(n, 300)) for n in range(20)]
    sink.commit()
    store.close()
    store, sink = open_store(fs)
    new = store.write(b"written before set_refs")
    store.incref(old[0])
    store.decref(old[1])  # counts before set_refs add to what it says
    sink.commit()
    assert store.file_count > 2 and store.compactions == 0
    store.set_refs({old[0]: 1, old[1]: 2})
    assert store.refcount(old[0]) == 2 and store.refcount(old[1]) == 1
    assert store.read(new) == b"written before set_refs" and store.refcount(new) == 1
    assert store.message_count == 3
    with pytest.raises(RuntimeError):
        store.set_refs({})


def test_other_files_in_the_directory_are_ignored() -> None:
    fs, store, sink = new_store()
    msg = store.write(b"x")
    sink.commit()
    store.close()
    fs.open_append(f"{DIR}/notes.txt").write(b"hello")
    store, _ = open_store(fs, refs={msg: 1})
    assert store.recovery.ignored_files == ["notes.txt"]
    assert store.read(msg) == b"x"


# -- crashes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
def test_crash_keeps_everything_committed(seed: int) -> None:
    fs = MemoryFS(seed=seed)
    store, sink = open_store(fs, refs={})
    committed = {store.write(body(n, 150)): body(n, 150) for n in range(40)}
    sink.commit()
    unsynced = {store.write(body(n, 150)): body(n, 150) for n in range(40, 60)}
    for f in list(sink.touched):
        f.flush()  # written but not synced: the crash may keep any prefix
    fs.crash()
    store, sink = open_store(fs, refs=dict.fromkeys(committed | unsynced, 1))
    for msg, payload in committed.items():
        assert store.read(msg) == payload
    survivors = [m for m in unsynced if store.contains(m)]
    assert survivors == sorted(unsynced)[:len(survivors)]  # a prefix of what was written
    for msg in survivors:
        assert store.read(msg) == unsynced[msg]
    assert store.write(b"next") > max(unsynced)


def test_torn_tail_is_truncated_and_reported() -> None:
    fs = MemoryFS()
    store, sink = open_store(fs, refs={})
    a = store.write(b"a" * 100)
    sink.commit()
    b = store.write(b"b" * 100)
    for f in list(sink.touched):
        f.flush()
    fs.crash(torn_bytes=50)
    store, _ = open_store(fs, refs={a: 1, b: 1})
    assert store.read(a) == b"a" * 100 and not store.contains(b)
    ((torn_path, torn),) = store.recovery.torn_tails
    assert torn_path == path(1) and torn.dropped_bytes == 50
    assert fs.size(path(1)) == torn.offset


def test_torn_tail_in_an_older_file_when_a_commit_spanned_a_rollover() -> None:
    fs = MemoryFS()
    store, sink = open_store(fs, limit=1024, refs={})
    first = store.write(body(0, 500))
    sink.commit()
    unsynced = [store.write(body(n, 500)) for n in range(1, 6)]  # rolls over twice before the next commit
    files = list(sink.touched)
    assert len(files) == 3
    for f in files:
        f.flush()
    files[-1].sync()  # the newest file synced, the older ones not: the crash tears them
    fs.crash(torn_bytes=10)
    store, _ = open_store(fs, limit=1024, refs=dict.fromkeys([first, *unsynced], 1))
    assert [p for p, _ in store.recovery.torn_tails] == [path(1), path(2)]
    assert store.read(first) == body(0, 500)
    assert store.contains(unsynced[-1]) and store.read(unsynced[-1]) == body(5, 500)


def test_interrupted_compaction_leaves_two_copies_and_recovery_picks_one() -> None:
    fs, store, sink = new_store()
    first, second = fill_two_files(store, sink)
    dead = first[:len(first) // 2 + 1]
    keep = first[len(dead):] + second
    for msg in dead:
        store.decref(msg)
    assert store.compactions == 1
    sink.commit()  # copies synced, file 1 deleted, but the deletion is not durable yet
    assert not fs.exists(path(1))
    fs.crash(torn=False)
    assert fs.exists(path(1))  # back: both copies exist
    store, _ = open_store(fs, refs=dict.fromkeys(keep, 1))
    assert store.recovery.duplicates == len(first) - len(dead)
    for msg in keep:
        n = first.index(msg) if msg in first else len(first)
        assert store.read(msg) == body(n, 300)
    assert not fs.exists(path(1))  # no live message left in it after set_refs
    assert store.message_count == len(keep)


def test_compaction_lost_in_a_crash_before_its_sync() -> None:
    fs, store, sink = new_store()
    first, second = fill_two_files(store, sink)
    dead = first[:len(first) // 2 + 1]
    keep = first[len(dead):] + second
    for msg in dead:
        store.decref(msg)
    for f in list(sink.touched):
        f.flush()  # copies written, not synced
    fs.crash()
    store, _ = open_store(fs, refs=dict.fromkeys(keep, 1))
    for msg in keep:
        n = first.index(msg) if msg in first else len(first)
        assert store.read(msg) == body(n, 300)


# -- corruption -------------------------------------------------------------------------------------------


def test_damage_in_the_middle_of_a_file_fails_recovery() -> None:
    fs, store, sink = new_store()
    a = store.write(body(1, 200))
    sink.commit()
    store.write(body(2, 200))
    sink.commit()
    store.close()
    inside_first = FILE_HEADER_BYTES + records.HEADER_BYTES + 50  # in the first record's payload
    fs.poke(path(1), inside_first)
    with pytest.raises(CorruptRecord) as err:
        open_store(fs)
    assert (err.value.file, err.value.offset) == (path(1), FILE_HEADER_BYTES)
    fs.poke(path(1), inside_first)  # repaired
    store, _ = open_store(fs, refs={a: 1})
    assert store.read(a) == body(1, 200)


def test_damage_in_the_file_header_fails_recovery() -> None:
    """The header holds the seed every record's checksum starts from: without it nothing in the file can
    be verified, so a damaged header is damage (never a torn tail that would drop the file's messages)."""
    fs, store, sink = new_store()
    a = store.write(body(1, 200))
    sink.commit()
    store.close()
    for offset in range(FILE_HEADER_BYTES):
        fs.poke(path(1), offset)
        with pytest.raises(CorruptRecord, match="bad file header") as err:
            open_store(fs)
        assert (err.value.file, err.value.offset) == (path(1), 0)
        fs.poke(path(1), offset)  # repaired
    store, _ = open_store(fs, refs={a: 1})
    assert store.read(a) == body(1, 200)


def test_damaged_entry_is_never_read_as_a_message() -> None:
    fs, store, sink = new_store()
    a = store.write(body(1, 200))
    b = store.write(body(2, 200))
    sink.commit()
    offset_b = FILE_HEADER_BYTES + records.HEADER_BYTES + 4 + ENTRY_HEAD.size + 200 + 4
    fs.poke(path(1), offset_b + ENTRY_HEAD.size + 17)  # a byte of b's payload
    assert store.read(a) == body(1, 200)
    with pytest.raises(CorruptRecord) as err:
        store.read(b)
    assert (err.value.file, err.value.offset) == (path(1), offset_b)
    fs.poke(path(1), offset_b + ENTRY_HEAD.size + 17)
    fs.poke(path(1), offset_b)  # its id
    with pytest.raises(CorruptRecord, match="expected"):
        store.read(b)


def test_every_single_byte_flip_is_caught_or_harmless() -> None:
    fs, store, sink = new_store()
    expected = {}
    for n in range(3):  # three records in one file
        expected[store.write(body(n, 20))] = body(n, 20)
        sink.commit()
    image = fs.read(path(1))
    last_record = scan_store_file(image).records[-1].offset
    for offset in range(len(image)):
        damaged = bytearray(image)
        damaged[offset] ^= 0x40
        fs = MemoryFS()
        fs.make_dirs(DIR)
        fs.open_append(path(1)).write(damaged)
        reader = MessageStore(fs, DIR, ManualSink())
        try:
            reader.recover()
        except CorruptRecord as exc:
            assert offset < last_record and exc.file == path(1)
            if offset < FILE_HEADER_BYTES:  # the seed is lost: nothing in the file can be verified
                assert (exc.offset, exc.reason) == (0, "bad file header")
            continue
        assert offset >= FILE_HEADER_BYTES, "a damaged file header must be caught"
        # A flip in the last record looks like a torn write: that record is dropped and reported.
        assert (offset >= last_record) == bool(reader.recovery.torn_tails)
        reader.set_refs(dict.fromkeys(expected, 1))
        for msg, payload in expected.items():
            if reader.contains(msg):
                assert reader.read(msg) == payload
        assert sum(map(reader.contains, expected)) == (2 if offset >= last_record else 3)


def test_a_file_that_cannot_be_compacted_is_kept() -> None:
    fs, store, sink = new_store()
    first, second = fill_two_files(store, sink)
    fs.poke(path(1), 100)  # inside the payload of the first message: file 1's only record is damaged
    for msg in first[1:len(first) // 2 + 2]:
        store.decref(msg)
    assert (store.compactions, store.compaction_failures) == (0, 1)
    assert fs.exists(path(1))
    with pytest.raises(CorruptRecord):
        store.read(first[0])
    rest = first[len(first) // 2 + 2:]
    assert [store.read(m) for m in rest] == [body(first.index(m), 300) for m in rest]
    for msg in [first[0], *rest]:
        store.decref(msg)
    assert not fs.exists(path(1))  # no live message: deleted even though it could not be compacted


# -- memory -----------------------------------------------------------------------------------------------


def test_memory_per_message_is_small() -> None:
    fs, store, sink = new_store(limit=1 << 20)
    store.write(b"warm up")
    sink.commit()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(5000):
            store.write(b"x" * 10)
        sink.commit()
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert used / 5000 < 300  # the index entry, plus the 35 bytes the message takes in the MemoryFS


# -- the property -----------------------------------------------------------------------------------------


class StoreMachine(RuleBasedStateMachine):
    """A model of the queue indexes: ``live`` msg_id -> [payload, refs]. ``committed`` ids were synced."""

    def __init__(self) -> None:
        super().__init__()
        self.seed = 0
        self.fs = MemoryFS(seed=0)
        self.store, self.sink = open_store(self.fs, limit=512, refs={})
        self.live: dict[int, list] = {}
        self.committed: set[int] = set()
        self.dead: set[int] = set()
        self.last_id = 0

    @rule(payload=st.binary(max_size=200), refs=st.integers(1, 3), durable=st.booleans())
    def write(self, payload: bytes, refs: int, durable: bool) -> None:
        msg = self.store.write(payload, refs=refs, durable=durable)
        assert msg > self.last_id and msg not in self.live
        self.last_id = msg
        self.dead.discard(msg)  # an id nothing names any more may come back after a restart
        self.live[msg] = [payload, refs]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def incref(self, data: st.DataObject) -> None:
        msg = data.draw(st.sampled_from(sorted(self.live)))
        self.store.incref(msg)
        self.live[msg][1] += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decref(self, data: st.DataObject) -> None:
        msg = data.draw(st.sampled_from(sorted(self.live)))
        self.store.decref(msg)
        self.live[msg][1] -= 1
        if self.live[msg][1] == 0:
            del self.live[msg]
            self.dead.add(msg)
            self.committed.discard(msg)

    @rule()
    def commit(self) -> None:
        self.sink.commit()
        self.committed = set(self.live)

    @rule(flush_first=st.booleans(), torn_bytes=st.none() | st.integers(0, 600),
          dir_ops_kept=st.none() | st.integers(0, 4))
    def crash_and_recover(self, flush_first: bool, torn_bytes: int | None, dir_ops_kept: int | None) -> None:
        if flush_first:
            for f in list(self.sink.touched):
                f.flush()  # written, not synced
        self.fs.crash(torn_bytes=torn_bytes, dir_ops_kept=dir_ops_kept)
        self._reopen()
        for msg in list(self.live):
            if msg in self.committed:
                assert self.store.contains(msg), f"committed message {msg} lost"
            if not self.store.contains(msg):
                del self.live[msg]
        self.committed = set(self.live)  # recovery keeps only what is on disk now

    @rule(flush_first=st.booleans())
    def kill_and_recover(self, flush_first: bool) -> None:
        """The process dies, the machine does not: what was written stays readable, but not yet synced."""
        if flush_first:
            for f in list(self.sink.touched):
                f.flush()
        self._reopen()
        for msg in list(self.live):
            if msg in self.committed:
                assert self.store.contains(msg), f"committed message {msg} lost"
            if not self.store.contains(msg):
                del self.live[msg]
        self.committed = set(self.live)  # recovery makes what it kept durable

    @rule()
    def restart(self) -> None:
        self.sink.commit()
        self.store.close()
        self._reopen()
        assert all(map(self.store.contains, self.live))
        self.committed = set(self.live)

    def _reopen(self) -> None:
        self.store, self.sink = open_store(self.fs, limit=512,
                                           refs={m: refs for m, (_, refs) in self.live.items()})
        for msg in self.dead:
            assert not self.store.contains(msg)
        self.last_id = max(self.live, default=0)  # new ids start above every id a queue still names

    @invariant()
    def every_live_message_reads_back(self) -> None:
        for msg, (payload, refs) in self.live.items():
            assert self.store.read(msg) == payload
            assert self.store.refcount(msg) == refs
        assert self.store.message_count == len(self.live)
        assert self.store.live_bytes == sum(len(p) + 16 for p, _ in self.live.values())


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=60, stateful_step_count=50, deadline=None)


@pytest.mark.slow  # the long run (`make test-slow`); `make test` runs 60 examples of the same machine
class TestStoreMachineLong(StoreMachine.TestCase):
    settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
