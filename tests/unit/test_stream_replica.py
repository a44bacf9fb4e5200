"""The stream replica protocol's pure parts: tails and agreement (stream_tail), the member machine
(stream_replica) step by step, and the coordinator (stream_coordinator). The seeded simulations with
faults are in tests/sim/test_stream_replication.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.cluster.stream_tail import EMPTY, Tail, agreed_next, must_reset, tail_key

# -- tails ----------------------------------------------------------------------------------------------


def test_tail_check_refuses_broken_tails() -> None:
    assert Tail(0, 10, ((1, 4), (2, 10))).check() == Tail(0, 10, ((1, 4), (2, 10)))
    for bad in (Tail(5, 3, ()), Tail(0, 10, ((2, 4), (1, 10))), Tail(0, 10, ((1, 4), (2, 9))),
                Tail(0, 10, ((1, 12),))):
        with pytest.raises(ValueError):
            bad.check()


def test_clip_trim_append() -> None:
    t = Tail(0, 10, ((1, 4), (2, 7), (3, 10)))
    assert t.clipped(7) == Tail(0, 7, ((1, 4), (2, 7)))
    assert t.clipped(5) == Tail(0, 5, ((1, 4), (2, 5)))
    assert t.clipped(0) == Tail(0, 0, ())
    assert t.trimmed(4) == Tail(4, 10, ((2, 7), (3, 10)))
    assert t.appended(3, 12) == Tail(0, 12, ((1, 4), (2, 7), (3, 12)))
    assert t.appended(5, 12) == Tail(0, 12, ((1, 4), (2, 7), (3, 10), (5, 12)))


def test_agreed_next_cases() -> None:
    writer = Tail(0, 20, ((1, 5), (3, 20)))
    assert agreed_next(writer, Tail(0, 3, ((1, 3),))) == 3                     # behind in a shared epoch
    assert agreed_next(writer, Tail(0, 8, ((1, 5), (3, 8)))) == 8              # behind in the last epoch
    assert agreed_next(writer, Tail(0, 9, ((1, 5), (2, 9)))) == 5              # epoch 2 lost: diverged at 5
    assert agreed_next(writer, Tail(0, 7, ((1, 7),))) == 5                     # epoch 1 longer there
    assert agreed_next(writer, EMPTY) == 0
    assert agreed_next(writer, writer) == 20
    # retention removed epoch 1 from the writer: the replica's epoch 3 vouches for what precedes it
    trimmed = writer.trimmed(6)
    assert agreed_next(trimmed, Tail(0, 12, ((1, 5), (3, 12)))) == 12
    # ... but a replica entirely below the writer's first offset must reset
    old = Tail(0, 4, ((1, 4),))
    agreed = agreed_next(trimmed, old)
    assert agreed == 0 and must_reset(trimmed, old, agreed)
    assert not must_reset(writer, old, agreed_next(writer, old))


def test_tail_key_orders_by_last_epoch_then_length() -> None:
    assert tail_key(Tail(0, 3, ((1, 1), (4, 3)))) > tail_key(Tail(0, 50, ((1, 50),)))
    assert tail_key(Tail(0, 9, ((2, 9),))) > tail_key(Tail(0, 8, ((2, 8),)))


@st.composite
def _logs(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Two logs of (epoch, chunk id) one-record chunks sharing a prefix, then each its own epochs."""
    shared = draw(st.lists(st.integers(1, 3), max_size=8))
    shared.sort()
    top = shared[-1] if shared else 0
    a = sorted(draw(st.lists(st.integers(top + 1, top + 3), max_size=5)))
    b = sorted(draw(st.lists(st.integers(top + 4, top + 6), max_size=5)))
    return ([(e, i) for i, e in enumerate(shared + a)], [(e, i) for i, e in enumerate(shared + b)])


def _tail(chunks: list[tuple[int, int]]) -> Tail:
    t = EMPTY
    for epoch, chunk_id in chunks:
        t = t.appended(epoch, chunk_id + 1)
    return t


@given(_logs())
@settings(max_examples=200, deadline=None)
def test_agreed_next_is_the_common_prefix(logs: tuple[list[tuple[int, int]], list[tuple[int, int]]]) -> None:
    a, b = logs
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    assert agreed_next(_tail(a), _tail(b)) == common
    assert agreed_next(_tail(b), _tail(a)) == common


# -- the member machine ---------------------------------------------------------------------------------


def _sends(effects: list[sr.Effect]) -> list[sr.Message]:
    return [e.message for e in effects if isinstance(e, sr.Send)]


def _writer_and_replica() -> tuple[sr.StreamMember, sr.StreamMember, sr.StreamMember]:
    view = sr.View(1, "a", ("a", "b", "c"), electing=False, stable=True)
    a, b, c = (sr.StreamMember(n, EMPTY) for n in "abc")
    # a fresh stream: nothing to carry, nothing to record, and the epoch is stable from its declaration
    assert a.observe(view) == [] and a.stable
    assert a.append(1) == (1, 0)   # the first message is at offset 0
    return a, b, c


def test_commit_needs_a_majority_on_disk() -> None:
    a, b, c = _writer_and_replica()
    view = sr.View(1, "a", ("a", "b", "c"), electing=False, stable=True)
    hello = _sends(b.observe(view))[0]
    assert isinstance(hello, sr.Hello) and hello.tail == EMPTY
    out = a.step(hello)
    start = _sends(out)[0]
    assert start == sr.Start(1, hello.session, 0, False, 0)
    assert sr.Ship("b", 0, 256 << 10) in out                   # the first chunk, written: shipped at once
    assert a.shipments() == []                               # one shipment at a time from one offset
    assert a.written(1) == []                                # one of three: no commit
    out = b.step(start)
    ack0 = _sends(out)[0]
    assert isinstance(ack0, sr.Ack) and ack0.next_offset == 0
    assert a.step(ack0) == []                                # nothing new acknowledged
    first = sr.ChunkRef(1, 0, 1, b"m")
    assert a.shipped("b", 1) == []                          # nothing more to ship
    out = b.step(sr.Chunks(1, (first,), a.commit))
    assert out == [sr.Write((first,))]
    ack = _sends(b.written(1))[0]
    assert ack == sr.Ack("b", 1, hello.session, 1)
    out = a.step(ack)
    assert out == [sr.Committed(1)]                         # (stable since the start: no Stable again)
    assert a.commit == 1


def test_replica_answers_a_gap_with_nack_and_ignores_repeats() -> None:
    a, b, _ = _writer_and_replica()
    view = sr.View(1, "a", ("a", "b", "c"), electing=False)
    hello = _sends(b.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    b.step(sr.Start(1, hello.session, 0, False, 0))
    late = sr.ChunkRef(1, 3, 5, b"x")
    assert _sends(b.step(sr.Chunks(1, (late,), 0))) == [sr.Nack("b", 1, hello.session, 0)]
    first = sr.ChunkRef(1, 0, 3, b"y")
    b.step(sr.Chunks(1, (first,), 0))
    b.written(3)
    # the same chunk again: nothing written, an Ack says where the replica is
    out = b.step(sr.Chunks(1, (first,), 0))
    assert not any(isinstance(e, sr.Write) for e in out)
    assert _sends(out) == [sr.Ack("b", 1, hello.session, 3)]


def test_stale_start_and_other_epochs_are_ignored() -> None:
    _, b, _ = _writer_and_replica()
    hello = _sends(b.observe(sr.View(1, "a", ("a", "b", "c"), electing=False)))[0]
    assert isinstance(hello, sr.Hello)
    assert b.step(sr.Start(1, hello.session - 1, 0, False, 0)) == []      # answers an older Hello
    assert b.step(sr.Start(2, hello.session, 0, False, 0)) == []          # another epoch
    assert b.step(sr.Chunks(1, (sr.ChunkRef(1, 0, 1, b""),), 0)) == []    # no session yet


def test_fencing_stops_the_old_writer_and_reports_the_durable_tail() -> None:
    a, b, _ = _writer_and_replica()
    a.written(1)
    a.append(2)                       # appended, not synced
    out = a.observe(sr.View(2, None, ("a", "b", "c"), electing=True))
    assert out == [sr.Report("a", 2, Tail(0, 1, ((1, 1),)))]
    assert a.role is sr.Role.IDLE
    # a message of the old epoch is refused now
    assert a.step(sr.Ack("b", 1, 1, 1)) == []
    # the member that is chosen keeps its log (the unsynced chunk too) and asks the coordinator to
    # record the log it begins from: no marker chunk, no offset
    out = a.observe(sr.View(2, "a", ("a", "b", "c"), electing=False))
    assert out == [sr.Begin(2, Tail(0, 3, ((1, 3),)))]
    assert not any(isinstance(e, sr.Ship | sr.Write) for _ in range(20) for e in a.tick())
    assert a.append(1) == (2, 3)      # the next message follows at once


def test_a_restarted_writer_asks_for_a_new_election() -> None:
    a = sr.StreamMember("a", Tail(0, 4, ((3, 4),)), fenced=3)
    assert a.observe(sr.View(3, "a", ("a", "b", "c"), electing=False)) == [sr.Reelect(3)]
    b = sr.StreamMember("b", EMPTY, fenced=3)
    assert isinstance(_sends(b.observe(sr.View(3, "a", ("a", "b", "c"), electing=False)))[0], sr.Hello)


def _carrying_writer() -> tuple[sr.StreamMember, sr.View]:
    # b holds epoch-1 chunks up to 2 that nobody is known to have committed; it writes epoch 2
    b = sr.StreamMember("b", Tail(0, 2, ((1, 2),)), fenced=2)
    b.restored = -1
    view = sr.View(2, "b", ("a", "b", "c"), electing=False)
    assert b.observe(view) == [sr.Begin(2, Tail(0, 2, ((1, 2),)))]
    assert b.carry and b.awaiting_record
    return b, view


def test_a_new_writer_does_not_commit_older_epochs_by_counting() -> None:
    # c acknowledges the old chunks: still nothing is committed while the start is not recorded
    b, view = _carrying_writer()
    c = sr.StreamMember("c", EMPTY, fenced=2)
    hello = _sends(c.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    b.step(hello)
    assert not any(isinstance(e, sr.Committed) for e in b.step(sr.Ack("c", 2, hello.session, 2)))
    assert b.observe(view) == [sr.Begin(2, Tail(0, 2, ((1, 2),)))]    # asked again (a lost proposal)
    b.append(1)
    b.written(3)
    assert sr.Committed(3) in b.step(sr.Ack("c", 2, hello.session, 3))   # its own chunk carries them


def test_a_recorded_start_commits_the_older_chunks_without_a_chunk() -> None:
    # the idle case: no publish comes; once the coordinator recorded b's start and a majority holds
    # exactly that log (acknowledged after the Start), the old chunks are committed at 2, no offset used
    b, view = _carrying_writer()
    c = sr.StreamMember("c", Tail(0, 3, ((1, 3),)), fenced=2)   # one more epoch-1 chunk than b
    c.restored = -1
    hello = _sends(c.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    out = b.step(hello)                                  # c holds 0..3: agreed at 2
    start = _sends(out)[0]
    assert isinstance(start, sr.Start) and start.from_offset == 2
    assert not any(isinstance(e, sr.Committed) for e in out)
    recorded = view._replace(recorded=True)
    b.written(2)
    assert b.observe(recorded) == []                     # recorded, but c has not cut its extra chunk
    out = c.step(start)
    assert sr.Truncate(2) in out
    ack = _sends(out)[0]
    assert ack == sr.Ack("c", 2, hello.session, 2)
    assert b.step(ack) == [sr.Committed(2), sr.Stable(2)]
    assert b.append(1) == (2, 2)                         # the epoch's first message at 2: no gap


def test_a_lost_ack_of_an_idle_epoch_is_said_again_at_the_heartbeat() -> None:
    b, view = _carrying_writer()
    b.observe(view._replace(recorded=True))
    b.written(2)
    c = sr.StreamMember("c", Tail(0, 2, ((1, 2),)), fenced=2)
    c.restored = -1
    hello = _sends(c.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    start = _sends(b.step(hello))[0]
    c.step(start)                                       # its Ack is lost; nothing is shipped
    beat = [m for m in _sends(b.tick()) if isinstance(m, sr.Commit)][0]
    again = _sends(c.step(beat))
    assert again == [sr.Ack("c", 2, hello.session, 2)]
    assert b.step(again[0]) == [sr.Committed(2), sr.Stable(2)]
    assert _sends(c.step(sr.Commit(2, 2))) == []        # caught up: no Ack at every heartbeat


def test_a_writer_whose_log_is_known_committed_writes_no_marker() -> None:
    # b followed writer 1 and learned that its whole log (epoch-1 chunks up to 5) is committed
    b = sr.StreamMember("b", Tail(0, 5, ((1, 5),)), fenced=2)
    b.restored = -1
    b.commit = 5
    view = sr.View(2, "b", ("a", "b", "c"), electing=False)
    assert b.observe(view) == [sr.Begin(2, Tail(0, 5, ((1, 5),))), sr.Committed(5)]
    assert not b.carry and b.start == 5 and not b.stable
    c = sr.StreamMember("c", Tail(0, 3, ((1, 3),)), fenced=2)
    c.restored = -1
    hello = _sends(c.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    out = b.step(hello)                       # c holds 0..3: not yet a majority at 5
    assert sr.Stable(2) not in out
    out = c.step(_sends(out)[0])
    assert _sends(out) == [sr.Ack("c", 2, hello.session, 3)]
    assert sr.Committed(3) in out             # the Start's commit point reaches c's readers at once
    c.step(sr.Chunks(2, (sr.ChunkRef(1, 3, 5, b"x"),), b.commit))
    assert b.step(_sends(c.written(5))[0]) == []   # a majority holds the log: stable once recorded
    assert b.observe(view._replace(recorded=True)) == [sr.Stable(2)]
    assert b.observe(view._replace(recorded=True)) == [sr.Stable(2)]  # said again while not taken
    assert b.append(2) == (2, 5)
    b.written(7)
    c.step(sr.Chunks(2, (sr.ChunkRef(2, 5, 7, b"y"),), b.commit))
    assert b.step(_sends(c.written(7))[0]) == [sr.Committed(7)]   # its own chunks, by counting


def test_a_writer_that_is_stable_at_its_hellos_needs_no_new_chunk() -> None:
    # an idle stream: the replicas already hold everything; their Acks after the Start and the record
    # make the epoch stable
    b = sr.StreamMember("b", Tail(0, 4, ((1, 4),)), fenced=2)
    b.restored, b.commit = -1, 4
    view = sr.View(2, "b", ("a", "b", "c"), electing=False, recorded=True)
    assert b.observe(view) == [sr.Committed(4)]
    a = sr.StreamMember("a", Tail(0, 4, ((1, 4),)), fenced=2)
    a.restored = -1
    hello = _sends(a.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    out = b.step(hello)
    assert not any(isinstance(e, sr.Ship) for e in out)
    ack = _sends(a.step(_sends(out)[0]))[0]
    assert b.step(ack) == [sr.Stable(2)]


def test_older_or_epoch_0_chunks_are_carried_by_the_record() -> None:
    view = sr.View(2, "b", ("a", "b", "c"), electing=False)
    # not known committed (commit below the end)
    b = sr.StreamMember("b", Tail(0, 5, ((1, 5),)), fenced=2)
    b.restored, b.commit = -1, 4
    assert b.observe(view) == [sr.Begin(2, Tail(0, 5, ((1, 5),))), sr.Committed(4)]
    # a stream of one member grown: its epoch-0 chunks are carried by epoch 1's recorded start, even
    # though the declaration made the epoch stable (one member: a majority of one)
    g = sr.StreamMember("g", Tail(0, 3, ((0, 3),)), fresh=True)
    out = g.observe(sr.View(1, "g", ("g",), electing=False, stable=True))
    assert out == [sr.Begin(1, Tail(0, 3, ((0, 3),)))]
    recorded = sr.View(1, "g", ("g",), electing=False, stable=True, recorded=True)
    assert g.observe(recorded) == [sr.Committed(3), sr.Stable(1)]
    assert g.append(2) == (1, 3)
    # an empty log that starts past 0 (reset to a writer's first offset)
    e = sr.StreamMember("e", Tail(7, 7, ()), fenced=2)
    e.restored, e.commit = -1, 7
    assert e.observe(sr.View(2, "e", ("a", "e", "c"), electing=False)) == [sr.Begin(2, Tail(7, 7, ())),
                                                                           sr.Committed(7)]


def test_a_publish_does_the_markers_work_under_load() -> None:
    # a publish before the record: its chunk carries the old chunks once it is on a majority
    b, view = _carrying_writer()
    assert b.append(3) == (2, 2)                  # the epoch's first own chunk: no offset lost
    c = sr.StreamMember("c", Tail(0, 2, ((1, 2),)), fenced=2)
    c.restored = -1
    hello = _sends(c.observe(view))[0]
    assert isinstance(hello, sr.Hello)
    out = b.step(hello)
    assert not any(isinstance(e, sr.Committed) for e in out)    # the old chunk is not counted alone
    c.step(_sends(out)[0])
    b.written(5)
    c.step(sr.Chunks(2, (sr.ChunkRef(2, 2, 5, b"p"),), b.commit))
    out = b.step(_sends(c.written(5))[0])
    assert sr.Committed(5) in out and sr.Stable(2) in out        # the publish carried the old chunk


def test_retention_past_a_lagging_replica_resets_it() -> None:
    a, b, _ = _writer_and_replica()
    hello = _sends(b.observe(sr.View(1, "a", ("a", "b", "c"), electing=False)))[0]
    assert isinstance(hello, sr.Hello)
    out = a.step(hello)
    assert sr.Ship("b", 0, 256 << 10) in out
    b.step(_sends(out)[0])
    a.written(1)
    a.append(5)
    a.written(6)
    a.commit = 6           # as if a third member had acknowledged
    a.retained(1)          # the segment with offset 0 is gone before b got it
    assert _sends(a.shipped("b", 0)) == [sr.Rehello(1, hello.session)]
    hello2 = _sends(b.step(sr.Rehello(1, hello.session)))[0]
    assert isinstance(hello2, sr.Hello) and hello2.session > hello.session
    start2 = _sends(a.step(hello2))[0]
    assert start2 == sr.Start(1, hello2.session, 1, True, 6)
    out = b.step(start2)
    assert out[0] == sr.Reset(1) and b.log == Tail(1, 1, ())


# -- the coordinator ------------------------------------------------------------------------------------


def test_coordinator_election_picks_the_greatest_tail_of_a_majority() -> None:
    s = sc.apply(sc.NONE, sc.Declare(("a", "b", "c"), "a"))
    assert s.view() == sr.View(1, "a", ("a", "b", "c"), False, True)
    s = sc.apply(s, sc.WriterDown(1))
    assert s.electing and s.epoch == 2
    assert sc.apply(s, sc.WriterDown(1)) is s
    s = sc.apply(s, sc.TailReport("b", 2, Tail(0, 5, ((1, 5),))))
    assert s.electing
    s = sc.apply(s, sc.TailReport("x", 2, Tail(0, 9, ((1, 9),))))  # not a member
    s = sc.apply(s, sc.TailReport("c", 1, Tail(0, 9, ((1, 9),))))  # another epoch
    assert s.electing
    s = sc.apply(s, sc.TailReport("c", 2, Tail(0, 7, ((1, 7),))))
    assert s.writer == "c" and s.epoch == 2 and not s.stable


def test_coordinator_member_changes_one_at_a_time_once_stable() -> None:
    s = sc.apply(sc.NONE, sc.Declare(("a", "b", "c"), "a"))
    s = sc.apply(s, sc.ChangeMembers(("a", "b", "c", "d")))
    assert s.writer == "a" and s.epoch == 2 and not s.stable
    with pytest.raises(sc.CoordinatorError, match="not settled"):
        sc.apply(s, sc.ChangeMembers(("a", "b", "c")))
    s = sc.apply(s, sc.EpochStable(2))
    with pytest.raises(sc.CoordinatorError, match="one at a time"):
        sc.apply(s, sc.ChangeMembers(("a", "b")))
    s = sc.apply(s, sc.ChangeMembers(("b", "c", "d")))      # the writer leaves: an election
    assert s.electing and s.epoch == 3
    with pytest.raises(sc.CoordinatorError):
        sc.apply(sc.NONE, sc.Declare(("a", "a"), "a"))
    with pytest.raises(sc.CoordinatorError):
        sc.apply(sc.NONE, sc.Declare(("a",), "b"))


def test_epoch_starts_are_recorded_once_and_pruned_when_a_later_epoch_is_stable() -> None:
    t1, t2 = Tail(0, 4, ((1, 4),)), Tail(0, 6, ((1, 4), (2, 6)))
    s = sc.apply(sc.NONE, sc.Declare(("a", "b", "c"), "a"))
    assert not s.view().recorded
    s = sc.apply(sc.apply(s, sc.WriterDown(1)), sc.EpochStart(2, t1))
    assert s.starts == ()                                   # electing: nothing recorded
    s = sc.apply(sc.apply(s, sc.TailReport("a", 2, t1)), sc.TailReport("b", 2, t1))
    s = sc.apply(s, sc.EpochStart(2, t1))
    assert s.view().recorded and s.starts == ((2, t1),)
    assert sc.apply(s, sc.EpochStart(2, t2)) is s           # once per epoch: the first wins
    assert sc.apply(s, sc.EpochStart(1, t2)) is s           # another epoch's
    s = sc.apply(sc.apply(s, sc.WriterDown(2)), sc.TailReport("a", 3, t2))
    s = sc.apply(s, sc.TailReport("c", 3, t1))
    assert s.writer == "a" and s.starts == ((2, t1),) and not s.view().recorded
    s = sc.apply(s, sc.EpochStart(3, t2))
    assert s.starts == ((2, t1), (3, t2))
    s = sc.apply(s, sc.EpochStable(3))
    assert s.stable and s.starts == ((3, t2),)             # older records decide no election any more


def test_a_recorded_start_ranks_its_log_at_its_epoch_figure_8() -> None:
    # Raft's Figure 8 on five members, with the marker replaced by a recorded start. Epoch 1 (writer a)
    # committed 0..4 everywhere, then wrote 4..6 to a and b only and died. c won epoch 2 (c, d, e
    # reported 0..4), wrote 4..5 to itself only and died. a won epoch 3 (a, b, d) and, idle, committed
    # 4..6 through its recorded start once a, b and d held exactly that log. a dies; c comes back.
    base, old = Tail(0, 4, ((1, 4),)), Tail(0, 6, ((1, 6),))
    c_log = Tail(0, 5, ((1, 4), (2, 5)))
    s = sc.CoordState(4, None, ("a", "b", "c", "d", "e"), (), starts=((3, old),))
    for member, tail in (("c", c_log), ("d", old), ("e", base)):
        s = sc.apply(s, sc.TailReport(member, 4, tail))
    assert sc.election_key(old, s.starts) == (3, 6) and sc.election_key(c_log, s.starts) == (2, 5)
    assert s.writer == "d"              # holds what was committed; c's epoch-2 chunk is cut
    # without the record's rank the log of the higher epoch wins, and the committed 4..6 would be cut
    assert max((c_log, old, base), key=sc.tail_key) == c_log
    # only a log that is exactly the start ranks at its epoch: not a prefix, not a longer one
    assert sc.election_key(Tail(0, 5, ((1, 5),)), s.starts) == (1, 5)
    assert sc.election_key(Tail(0, 7, ((1, 7),)), s.starts) == (1, 7)
    assert sc.election_key(Tail(2, 6, ((1, 6),)), s.starts) == (3, 6)   # retention: unknown, not different


@given(_logs(), st.integers(0, 20))
@settings(max_examples=300, deadline=None)
def test_agreed_next_never_claims_past_the_common_prefix_after_retention(
        logs: tuple[list[tuple[int, int]], list[tuple[int, int]]], cut: int) -> None:
    a, b = logs
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    writer = _tail(a)
    writer = writer.trimmed(min(cut, writer.next))
    agreed = agreed_next(writer, _tail(b))
    if not must_reset(writer, _tail(b), agreed):
        assert agreed <= common
        assert agreed >= writer.first or not b


# -- the wire and the Raft log --------------------------------------------------------------------------


def test_replica_messages_round_trip_through_msgpack() -> None:
    import msgpack
    tail = Tail(3, 9, ((1, 5), (2, 9)))
    for m in (sr.Hello("n2", 4, 1 << 33, tail), sr.Start(4, 7, 5, True, 3),
              sr.Chunks(4, (sr.ChunkRef(2, 5, 7, b"\x00raw"), sr.ChunkRef(4, 7, 8, b"x")), 6),
              sr.Ack("n2", 4, 7, 8), sr.Nack("n3", 4, 7, 5), sr.Rehello(4, 7), sr.Commit(4, 8)):
        wire = msgpack.unpackb(msgpack.packb(sr.message_to_wire(m)))
        assert sr.message_from_wire(wire) == m


@pytest.mark.parametrize("bad", [None, [], [99], [0, "n", 1], [1, 1, 2, 3, 4, 5, 6], [2, 1, [[1, 2]], 3],
                                 [0, "n", 1, 1, [5, 3, []]], "text", [6, "x", 1]])
def test_malformed_replica_messages_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="malformed|not a stream tail"):
        sr.message_from_wire(bad)


def test_coordinator_commands_and_snapshot_round_trip() -> None:
    tail = Tail(0, 9, ((1, 9),))
    for cmd in (sc.Declare(("a", "b", "c"), "a"), sc.WriterDown(3), sc.TailReport("b", 4, tail),
                sc.ChangeMembers(("a", "b")), sc.EpochStable(2), sc.Barrier(1 << 61), sc.EpochStart(5, tail)):
        assert sc.decode_command(sc.encode_command(cmd)) == cmd
    for bad in (b"", b"\x93\x02\x00\x01", b"\x92\x01\x09", b"\x93\x01\x01\xa1x"):
        with pytest.raises(sc.CoordinatorError):
            sc.decode_command(bad)
    seen: list[sc.CoordState] = []
    m = sc.CoordinatorMachine(seen.append)
    m.apply(1, sc.encode_command(sc.Declare(("a", "b", "c"), "a")))
    m.apply(2, sc.encode_command(sc.WriterDown(1)))
    m.apply(3, sc.encode_command(sc.TailReport("b", 2, tail)))
    with pytest.raises(sc.CoordinatorError):
        m.apply(4, sc.encode_command(sc.ChangeMembers(("a",))))
    copy = sc.CoordinatorMachine(seen.append)
    copy.restore(m.snapshot())
    assert copy.state == m.state and m.state.reports == (("b", tail),)
    assert [s.epoch for s in seen] == [1, 2, 2, 2]
    m.apply(5, sc.encode_command(sc.Barrier(77)))           # changes nothing; the machine notes the token
    assert m.barriers_seen == {77} and len(seen) == 4
    # a member never acts on a view older than an epoch its own log holds
    late = sr.StreamMember("c", Tail(0, 9, ((5, 9),)), fenced=2)
    assert late.fenced == 5 and late.observe(sr.View(4, "c", ("a", "b", "c"), electing=False)) == []


def test_a_members_effects_become_coordinator_commands() -> None:
    tail = Tail(0, 4, ((2, 4),))
    assert sc.command_for(sr.Report("b", 3, tail)) == sc.TailReport("b", 3, tail)
    assert sc.command_for(sr.Reelect(3)) == sc.WriterDown(3)
    assert sc.command_for(sr.Stable(3)) == sc.EpochStable(3)
    assert sc.command_for(sr.Begin(3, tail)) == sc.EpochStart(3, tail)


def test_a_snapshot_from_before_epoch_starts_restores() -> None:
    import msgpack
    tail = Tail(0, 9, ((1, 9),))
    old = msgpack.packb([sc.VERSION, 3, "b", ["a", "b", "c"], [], True])   # what main wrote
    assert sc.restore_state(old) == sc.CoordState(3, "b", ("a", "b", "c"), (), True, ())
    state = sc.CoordState(4, "a", ("a", "b"), (), False, ((4, tail),))
    assert sc.restore_state(sc.snapshot_state(state)) == state
