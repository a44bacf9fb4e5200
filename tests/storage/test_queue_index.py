"""The classic queue index on an in-memory file system: segments, acks, recovery, crashes, damage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.storage.appendfile import ManualSink
from hutch.storage.errors import CorruptRecord
from hutch.storage.memfs import MemoryFS
from hutch.storage.queue_index import QueueIndex, segment_name

DIR = "/data/queues/q1"
PROPS = b"\x10\x00\x02"  # delivery_mode present, = 2


def make(fs: MemoryFS, sink: ManualSink | None = None, entries: int = 16) -> tuple[QueueIndex, ManualSink]:
    sink = sink or ManualSink()
    return QueueIndex(fs, DIR, sink, segment_entries=entries), sink


class Msg:
    """The fields of hutch.core.message.Message the index reads."""

    def __init__(self, exchange: str, routing_key: str, properties_raw: bytes, body: bytes) -> None:
        self.exchange = exchange
        self.routing_key = routing_key
        self.properties_raw = properties_raw
        self.body = body
        ex, rk = exchange.encode(), routing_key.encode()
        self.route_tail = bytes((len(ex),)) + ex + bytes((len(rk),)) + rk
        self.store_id = 0


def publish(index: QueueIndex, seqs: range | list[int], persistent: bool = True) -> None:
    for s in seqs:
        index.publish(s, persistent, Msg("ex", f"rk{s}", PROPS, f"body{s}".encode()))


def bodies(index: QueueIndex, start: int = 1) -> list[bytes]:
    out: list[bytes] = []
    seq = start
    while seq <= index.max_seq:
        msgs, seq = index.read_from(seq)
        out.extend(m[5] for m in msgs)
    return out


def test_entries_land_in_fixed_size_segments_and_read_back_in_order() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 40))
    sink.commit()
    assert index.segments() == [0, 1, 2]
    assert fs.list_dir(DIR) == [segment_name(0), segment_name(1), segment_name(2)]
    msgs, nxt = index.read_from(5)
    assert [m[0] for m in msgs] == list(range(5, 16)) and nxt == 16
    assert msgs[0] == (5, True, "ex", "rk5", PROPS, b"body5", 0, 0)
    assert bodies(index) == [f"body{s}".encode() for s in range(1, 40)]


def test_unflushed_entries_are_readable() -> None:
    index, _sink = make(MemoryFS())
    publish(index, range(1, 5))
    assert bodies(index) == [b"body1", b"body2", b"body3", b"body4"]


def test_acked_entries_are_gone_and_full_segments_deleted() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 40))
    index.ack(list(range(1, 16)))  # all of segment 0 (seqs 1..15)
    index.ack([16, 18])
    sink.commit()
    assert segment_name(0) not in fs.list_dir(DIR)
    assert bodies(index)[:3] == [b"body17", b"body19", b"body20"]
    assert index.live_count == 39 - 17


def test_recovery_keeps_persistent_unacked_entries_only() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 21))
    publish(index, range(21, 31), persistent=False)  # paged-out transient messages
    publish(index, range(31, 36))
    index.mark_delivered(3)
    index.ack([1, 2])
    sink.commit()
    index2, _ = make(fs)
    found = index2.recover()
    assert found.live == 18 + 5
    assert found.first_live_seq == 3
    assert found.max_seq == 35
    assert found.delivered_upto == 3
    assert [m[0] for m in index2.read_from(3)[0]] == list(range(3, 16))
    assert bodies(index2, 3) == [f"body{s}".encode() for s in [*range(3, 21), *range(31, 36)]]
    # new seqs continue above everything written before, even in a segment with dead entries
    publish(index2, [36, 37], persistent=False)
    assert bodies(index2, 36) == [b"body36", b"body37"]


def test_seqs_are_never_reused_after_a_fully_acked_tail() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 6))
    index.ack(list(range(1, 6)))
    sink.commit()
    index2, _ = make(fs)
    found = index2.recover()
    assert found.live == 0 and found.max_seq == 5


def test_crash_loses_only_unsynced_entries_and_tolerates_a_torn_tail() -> None:
    for seed in range(20):
        fs = MemoryFS(seed=seed)
        index, sink = make(fs)
        publish(index, range(1, 11))
        sink.commit()
        publish(index, range(11, 21))
        for f in index.open_files():
            f.flush()  # written, not synced: a crash may keep any prefix of it
        fs.crash()
        index2, _ = make(fs)
        found = index2.recover()
        assert 10 <= found.live <= 20
        got = bodies(index2)
        assert got[:10] == [f"body{s}".encode() for s in range(1, 11)]
        assert got == [f"body{s}".encode() for s in range(1, found.live + 1)]


def test_damage_in_the_middle_is_reported_not_skipped() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 4))
    sink.commit()
    publish(index, range(4, 8))
    sink.commit()
    fs.poke(f"{DIR}/{segment_name(0)}", 20)
    index2, _ = make(fs)
    with pytest.raises(CorruptRecord):
        index2.recover()


def test_delete_removes_the_directory() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 40))
    sink.commit()
    index.delete()
    sink.commit()
    assert not fs.exists(f"{DIR}/{segment_name(1)}")


def test_ack_from_purges_the_paged_out_part() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 40))
    assert index.ack_from(10) == 30
    sink.commit()
    index2, _ = make(fs)
    assert index2.recover().live == 9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["pub", "tpub", "ack", "commit", "crash"]), st.integers(0, 30)),
                max_size=60), st.integers(0, 1000))
def test_recovery_matches_a_model(ops: list[tuple[str, int]], seed: int) -> None:
    """Committed persistent unacked entries always come back; acked committed ones never do."""
    fs = MemoryFS(seed=seed)
    index, sink = make(fs, entries=8)
    index.recover()
    next_seq = 1
    live: dict[int, bool] = {}  # seq -> persistent
    committed_live: set[int] = set()
    committed_acked: set[int] = set()
    pending_acks: set[int] = set()
    for op, n in ops:
        if op in ("pub", "tpub"):
            publish(index, [next_seq], persistent=op == "pub")
            live[next_seq] = op == "pub"
            next_seq += 1
        elif op == "ack" and live:
            seq = sorted(live)[n % len(live)]
            index.ack([seq])
            del live[seq]
            pending_acks.add(seq)
        elif op == "commit":
            sink.commit()
            committed_live = {s for s, p in live.items() if p}
            committed_acked |= pending_acks
            pending_acks.clear()
        elif op == "crash":
            fs.crash()
            index, sink = make(fs, entries=8)
            found = index.recover()
            got = set()
            seq = found.first_live_seq or 1
            while seq <= found.max_seq:
                msgs, seq = index.read_from(seq)
                got.update(m[0] for m in msgs)
            assert committed_live - pending_acks <= got
            assert not got & committed_acked
            assert all(s < next_seq for s in got)
            live = {s: True for s in got}
            committed_live = set(got)
            pending_acks.clear()
            next_seq = max(next_seq, found.max_seq + 1)


def test_deleting_a_queue_keeps_copies_salvage_set_aside() -> None:
    fs = MemoryFS()
    index, sink = make(fs)
    publish(index, range(1, 4))
    sink.commit()
    aside = f"{DIR}/{segment_name(0)}.damaged-20261122T000000Z"
    fs.open_append(aside).write(b"kept")
    index.delete()
    sink.commit()
    assert fs.list_dir(DIR) == [aside.rsplit("/", 1)[1]]
