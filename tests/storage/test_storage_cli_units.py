"""hutch-storage check/salvage of queue index and message store files, on files written by the real
QueueIndex and MessageStore (no node): torn tail versus damage, entry checksums, re-framing, and that a
copy moved aside is ignored by the index, the store and the tool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hutch.amqp.spec import BasicProperties
from hutch.cli import storage as cli
from hutch.core.message import Message
from hutch.storage import records
from hutch.storage.appendfile import ENTRY_LEN, ManualSink, iter_entries
from hutch.storage.errors import CorruptRecord
from hutch.storage.fs import RealFS
from hutch.storage.msg_store import ENTRY_HEAD, STORE_RECORD_TYPE, MessageStore, parse_file_name
from hutch.storage.queue_index import INDEX_RECORD_TYPE, QueueIndex, decode_message

QUEUE = "queues/0123456789abcdef01234567"
STORE = "msg_stores/89abcdef0123456789abcdef"
PROPS = BasicProperties(delivery_mode=2)


def build(data: Path, sessions: int = 4, small: int = 3, large: int = 2) -> None:
    """A data directory with one queue index and one store; one flush (one record per file) per session."""
    fs = RealFS()
    sink = ManualSink()
    store = MessageStore(fs, str(data / STORE), sink)
    store.recover()
    index = QueueIndex(fs, str(data / QUEUE), sink, store=store, embed_below=1000)
    seq = 0
    for part in range(sessions):
        for i in range(small):
            seq += 1
            index.publish(seq, True, Message("", "q", PROPS, f"s{part}-{i}".encode() * 10))
        for i in range(large):
            seq += 1
            index.publish(seq, True, Message("", "q", PROPS, bytes([65 + part]) * 2000 + str(i).encode()))
        sink.commit()
    store.close()
    for f in index.open_files():
        f.close()


def only(directory: Path, suffix: str) -> Path:
    (path,) = [p for p in directory.iterdir() if p.name.endswith(suffix)]
    return path


def flip_in_record(path: Path, which: int, fix_crc: bool = False, at: float = 0.5) -> records.Record:
    """XOR one byte `at` (a fraction) into record `which`'s payload; with `fix_crc` re-frame the record so
    that only an entry's own checksum can tell."""
    raw = bytearray(path.read_bytes())
    rec = records.scan(bytes(raw)).records[which]
    body = rec.offset + records.HEADER_BYTES
    raw[body + int(len(rec.payload) * at)] ^= 0xFF
    if fix_crc:
        raw[rec.offset:rec.end] = records.encode(rec.type, bytes(raw[body:rec.end]))
    path.write_bytes(bytes(raw))
    return rec


def recover(data: Path) -> tuple[MessageStore, QueueIndex]:
    fs = RealFS()
    sink = ManualSink()
    store = MessageStore(fs, str(data / STORE), sink)
    store.recover()
    return store, QueueIndex(fs, str(data / QUEUE), sink, store=store, embed_below=1000)


def test_clean_directory_checks_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    assert cli.main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{QUEUE}: 1 segment file clean, 20 entries" in out
    assert f"{STORE}: 1 store file clean, 8 messages" in out
    assert "all 2 files and logs clean" in out


def test_torn_tail_is_reported_but_not_damage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    qix = only(tmp_path / QUEUE, ".qix")
    with open(qix, "ab") as f:
        f.write(records.encode(INDEX_RECORD_TYPE, b"\x04\x00\x00\x00abcd")[:-3])  # an unfinished write
    assert cli.main(["check", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{QUEUE}/{qix.name}: torn tail (harmless: an unfinished write), 14 bytes" in out
    assert "DAMAGED" not in out
    assert cli.main(["salvage", str(tmp_path)]) == 0
    assert "nothing damaged to salvage" in capsys.readouterr().out
    assert not [p for p in (tmp_path / QUEUE).iterdir() if ".damaged-" in p.name]


def test_damaged_index_record_is_salvaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    qix = only(tmp_path / QUEUE, ".qix")
    before = records.scan(qix.read_bytes()).records
    lost = flip_in_record(qix, 1)
    assert cli.main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{QUEUE}/{qix.name}: DAMAGED; bad records at bytes [{lost.offset}:{lost.end}] (checksum mismatch)" in out
    with pytest.raises(CorruptRecord):
        recover(tmp_path)[1].recover()

    assert cli.main(["salvage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"rebuilt with 3 records (15 entries); lost bytes [{lost.offset}:{lost.end}]" in out
    assert "bring back messages acknowledged" in out
    aside = [p for p in (tmp_path / QUEUE).iterdir() if ".damaged-" in p.name]
    assert len(aside) == 1 and aside[0].name.startswith(qix.name + ".damaged-")
    after = records.scan(qix.read_bytes()).records
    assert [bytes(r.payload) for r in after] == [bytes(r.payload) for i, r in enumerate(before) if i != 1]

    assert cli.main(["check", str(tmp_path)]) == 0
    assert "1 damaged copy kept aside" in capsys.readouterr().out
    store, index = recover(tmp_path)
    assert index.segments() == [0]  # the copy moved aside is not a segment
    found = index.recover()
    assert found.live == 15
    assert all(store.contains(i) for i in found.refs.values())


def test_a_store_entry_with_a_bad_checksum_is_never_served_and_salvage_drops_only_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    rdq = only(tmp_path / STORE, ".rdq")
    rec = flip_in_record(rdq, 2, fix_crc=True, at=0.75)  # session 2's record: messages 5 and 6; hits 6
    store, _index = recover(tmp_path)  # record checksums all verify: recovery cannot tell
    assert store.read(5)
    with pytest.raises(CorruptRecord, match="checksum mismatch in message 6"):
        store.read(6)

    assert cli.main(["check", str(tmp_path)]) == 1
    assert "bad entries at bytes" in capsys.readouterr().out
    assert cli.main(["salvage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "rebuilt with 4 records (7 messages)" in out and "lost messages 6;" in out
    new = records.scan(rdq.read_bytes()).records
    assert len(new) == 4
    entries = [bytes(e) for e in iter_entries(new[2].payload)]
    assert len(entries) == 1 and ENTRY_HEAD.unpack_from(entries[0])[0] == 5
    assert new[2].payload.tobytes() == ENTRY_LEN.pack(len(entries[0])) + entries[0]
    assert new[2].payload.tobytes() == rec.payload.tobytes()[:len(new[2].payload)]
    assert cli.main(["check", str(tmp_path)]) == 0
    capsys.readouterr()

    store, index = recover(tmp_path)
    assert parse_file_name(next(p.name for p in (tmp_path / STORE).iterdir() if ".damaged-" in p.name)) is None
    assert len(store.recovery.ignored_files) == 1
    assert not store.contains(6)
    assert decode_message(store.read(5))[3] == bytes([67]) * 2000 + b"0"
    found = index.recover()
    assert sorted(seq for seq, i in found.refs.items() if not store.contains(i)) == [15]  # the node drops it


def test_damaged_store_record_is_salvaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    rdq = only(tmp_path / STORE, ".rdq")
    lost = flip_in_record(rdq, 0)
    with pytest.raises(CorruptRecord):
        recover(tmp_path)
    assert cli.main(["check", str(tmp_path)]) == 1
    assert "DAMAGED" in capsys.readouterr().out
    assert cli.main(["salvage", str(tmp_path)]) == 0
    assert f"lost bytes [{lost.offset}:{lost.end}]" in capsys.readouterr().out
    store, _index = recover(tmp_path)
    assert sorted(i for i in range(1, 9) if store.contains(i)) == [3, 4, 5, 6, 7, 8]
    assert all(r.type == STORE_RECORD_TYPE for r in records.scan(rdq.read_bytes()).records)


def test_names_moved_aside_are_not_storage_files() -> None:
    for name in ("00000000.qix.damaged-20260101T000000Z", "00000000.qix.salvage-tmp"):
        assert not cli.INDEX.is_file(name)
    for name in ("00000001.rdq.damaged-20260101T000000Z", "00000001.rdq.salvage-tmp"):
        assert not cli.STORE.is_file(name) and parse_file_name(name) is None
    assert cli.INDEX.is_file("00000000.qix") and cli.STORE.is_file("00000001.rdq")


def test_index_ignores_a_copy_moved_aside(tmp_path: Path) -> None:
    build(tmp_path)
    qix = only(tmp_path / QUEUE, ".qix")
    os.link(qix, str(qix) + ".damaged-20260101T000000Z")
    _store, index = recover(tmp_path)
    assert index.segments() == [0]


def test_an_index_entry_of_unknown_kind_in_a_valid_record_is_damage(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path)
    qix = only(tmp_path / QUEUE, ".qix")
    bogus = b"\x09" + bytes(8)
    with open(qix, "ab") as f:  # checksummed, but the node cannot read it (unknown entry type)
        f.write(records.encode(INDEX_RECORD_TYPE, ENTRY_LEN.pack(len(bogus)) + bogus))
    with pytest.raises(CorruptRecord):
        recover(tmp_path)[1].recover()
    assert cli.main(["check", str(tmp_path)]) == 1
    assert "unknown queue index entry type 9" in capsys.readouterr().out
    assert cli.main(["salvage", str(tmp_path)]) == 0
    assert "rebuilt with 4 records (20 entries)" in capsys.readouterr().out
    assert recover(tmp_path)[1].recover().live == 20
