"""The old home's durable promises of compaction of load (runtime/compaction.py's `_Promises`): what a
worker writes, synced, before it agrees to a move, and reads back at its restart."""

from __future__ import annotations

from pathlib import Path

from hutch.runtime.compaction import PROMISES_FILE, _Promises


def test_a_promise_is_read_back_after_a_restart_and_gone_once_dropped(tmp_path: Path) -> None:
    p = _Promises(str(tmp_path))
    p.put(("/", "q1"), "n@h#w0")
    p.put(("v", "q2"), "n@h#w1")
    again = _Promises(str(tmp_path))
    again.load()
    assert again.items == {("/", "q1"): "n@h#w0", ("v", "q2"): "n@h#w1"}
    again.drop(("/", "q1"))
    again.drop(("/", "absent"))  # nothing to drop: nothing written
    last = _Promises(str(tmp_path))
    last.load()
    assert last.items == {("v", "q2"): "n@h#w1"}
    assert not (tmp_path / (PROMISES_FILE + ".tmp")).exists()


def test_no_file_or_a_damaged_one_means_no_promise(tmp_path: Path) -> None:
    p = _Promises(str(tmp_path))
    p.load()
    assert p.items == {}
    for text in (b"{not json", b'{"a": 1}', b'[["/", "q"], [1, 2, 3], ["/", "q", "w", "x"], "s"]', b"\xff\xfe"):
        (tmp_path / PROMISES_FILE).write_bytes(text)
        p = _Promises(str(tmp_path))
        p.load()
        assert p.items == {}, text
    (tmp_path / PROMISES_FILE).write_bytes(b'[["/", "q", "w"], ["/", 5, "w"]]')
    p = _Promises(str(tmp_path))
    p.load()
    assert p.items == {("/", "q"): "w"}
