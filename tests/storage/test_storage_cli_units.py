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
from hutch.storage.appendfile import (
    ENTRY_LEN,
    FILE_HEADER_BYTES,
    ManualSink,
    iter_entries,
    read_seed,
    scan_file,
)
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


def seed_of(path: Path) -> int:
    seed = read_seed(path.read_bytes())
    assert seed is not None, f"{path} has no valid file header"
    return seed


def file_records(path: Path) -> list[records.Record]:
    """The records of a .qix or .rdq file after its header, checked with the file's seed; no torn tail."""
    rtype = STORE_RECORD_TYPE if path.name.endswith(".rdq") else INDEX_RECORD_TYPE
    _seed, result = scan_file(path.read_bytes(), str(path), rtype)
    assert result.torn_tail is None
    return result.records


def flip_in_record(path: Path, which: int, fix_crc: bool = False, at: float = 0.5) -> records.Record:
    """XOR one byte `at` (a fraction) into record `which`'s payload; with `fix_crc` re-frame the record (with
    the file's seed) so that only an entry's own checksum can tell."""
    rec = file_records(path)[which]
    raw = bytearray(path.read_bytes())
    body = rec.offset + records.HEADER_BYTES
    raw[body + int(len(rec.payload) * at)] ^= 0xFF
    if fix_crc:
        raw[rec.offset:rec.end] = records.encode(rec.type, bytes(raw[body:rec.end]), seed_of(path))
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
        f.write(records.encode(INDEX_RECORD_TYPE, b"\x04\x00\x00\x00abcd", seed_of(qix))[:-3])  # unfinished
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
    before = file_records(qix)
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
    assert seed_of(qix) == seed_of(aside[0])  # rewritten with the same header and seed
    after = file_records(qix)
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
    new = file_records(rdq)
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
    assert [r.type for r in file_records(rdq)] == [STORE_RECORD_TYPE] * 3


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
        f.write(records.encode(INDEX_RECORD_TYPE, ENTRY_LEN.pack(len(bogus)) + bogus, seed_of(qix)))
    with pytest.raises(CorruptRecord):
        recover(tmp_path)[1].recover()
    assert cli.main(["check", str(tmp_path)]) == 1
    assert "unknown queue index entry type 9" in capsys.readouterr().out
    assert cli.main(["salvage", str(tmp_path)]) == 0
    assert "rebuilt with 4 records (20 entries)" in capsys.readouterr().out
    assert recover(tmp_path)[1].recover().live == 20


def test_a_record_without_the_file_seed_is_damage_not_a_record(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A well-formed record framed without the file's seed (as one inside a message body would be) never
    passes for a record of the file: followed by a valid record it is damage, and salvage does not keep it."""
    build(tmp_path, sessions=1)
    qix = only(tmp_path / QUEUE, ".qix")
    bogus = b"\x09" + bytes(8)
    unseeded = records.encode(INDEX_RECORD_TYPE, ENTRY_LEN.pack(len(bogus)) + bogus)
    valid = records.encode(INDEX_RECORD_TYPE, b"", seed_of(qix))  # a record of the file (no entries)
    with open(qix, "ab") as f:
        f.write(unseeded + valid)
    assert cli.main(["check", str(tmp_path)]) == 1
    assert "checksum mismatch" in capsys.readouterr().out
    assert cli.main(["salvage", str(tmp_path)]) == 0
    capsys.readouterr()
    assert len(file_records(qix)) == 2
    assert recover(tmp_path)[1].recover().live == 5


@pytest.mark.parametrize("which", ["index", "store"])
@pytest.mark.parametrize("offset", [0, 4, 8, 12, 20])  # its length, crc, type, magic and seed
def test_a_damaged_file_header_loses_the_file_and_salvage_replaces_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str, offset: int) -> None:
    """Without its header a file's seed is lost and none of its records can be verified: `check` reports the
    whole file damaged, the node refuses to start, and salvage keeps the file aside and starts it afresh."""
    build(tmp_path)
    path = only(tmp_path / (QUEUE if which == "index" else STORE), ".qix" if which == "index" else ".rdq")
    raw = bytearray(path.read_bytes())
    size = len(raw)
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))

    assert cli.main(["check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{path.name}: DAMAGED; bad records at bytes [0:{size}] (bad file header" in out
    assert "0 records and 0" in out
    with pytest.raises(CorruptRecord, match="bad file header") as err:
        recover(tmp_path)[1].recover()
    assert (err.value.file, err.value.offset) == (str(path), 0)

    assert cli.main(["salvage", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"rebuilt with 0 records (0 {'entries' if which == 'index' else 'messages'}); lost bytes [0:{size}]" in out
    (aside,) = [p for p in path.parent.iterdir() if ".damaged-" in p.name]
    assert aside.name.startswith(path.name + ".damaged-") and aside.read_bytes() == bytes(raw)
    assert len(path.read_bytes()) == FILE_HEADER_BYTES and seed_of(path)  # a fresh, empty file
    assert file_records(path) == []
    assert cli.main(["check", str(tmp_path)]) == 0
    capsys.readouterr()

    store, index = recover(tmp_path)
    found = index.recover()
    if which == "index":
        assert found.live == 0
    else:  # every message of the store is lost; the node drops the queue entries naming them
        assert found.live == 20 and not any(store.contains(i) for i in range(1, 9))
        assert sorted(found.refs.values()) == list(range(1, 9))
