"""The on-confirm ledger of a shovel worker (runtime/shovel/worker.py), driven without sockets: whatever
order and grouping the destination's confirms come in (multiple acks, single acks out of order, nacks),
every source delivery is settled exactly once, acked if and only if its publish was confirmed, and
`src-delete-after` counts exactly the acked ones."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp import spec
from hutch.core.shovel import parse_shovel
from hutch.runtime.shovel.worker import ShovelWorker


class FakeSource:
    """A consumer channel's unacked deliveries, with basic.ack/nack/reject semantics (406 on an unknown tag)."""

    def __init__(self) -> None:
        self.outstanding: set[int] = set()
        self.acked: list[int] = []
        self.requeued: list[int] = []

    def ack(self, tag: int, multiple: bool = False) -> None:
        assert tag in self.outstanding, f"ack of unknown delivery tag {tag}"
        done = {t for t in self.outstanding if t <= tag} if multiple else {tag}
        self.outstanding -= done
        self.acked += sorted(done)

    def send(self, method: Any) -> None:
        assert isinstance(method, spec.Basic.Nack | spec.Basic.Reject) and method.requeue
        assert method.delivery_tag in self.outstanding and not getattr(method, "multiple", False)
        self.outstanding.discard(method.delivery_tag)
        self.requeued.append(method.delivery_tag)

    def pause_reading(self) -> None:
        raise AssertionError("the destination never pauses here")


class FakeDest:
    write_paused = False

    def __init__(self) -> None:
        self.seq = 0
        self.published: list[tuple[str, str]] = []

    def publish(self, exchange: str, key: str, props: bytes, body: bytes) -> int:
        self.seq += 1
        self.published.append((exchange, key))
        return self.seq


@st.composite
def confirm_plans(draw: Any) -> tuple[int, list[tuple[int, bool, bool]]]:
    """N publishes and the destination's confirms: each seq confirmed once, singly (in any order) or in
    multiple acks of in-order runs; some single ones are nacks."""
    n = draw(st.integers(min_value=1, max_value=40))
    seqs = list(range(1, n + 1))
    events: list[tuple[int, bool, bool]] = []  # (seq, multiple, ack)
    pending = seqs[:]
    while pending:
        if draw(st.booleans()):  # a multiple ack up to some pending seq
            upto = draw(st.sampled_from(pending))
            events.append((upto, True, True))
            pending = [s for s in pending if s > upto]
        else:
            s = draw(st.sampled_from(pending))
            events.append((s, False, draw(st.booleans())))
            pending.remove(s)
    return n, events


@settings(max_examples=300, deadline=None)
@given(confirm_plans(), st.integers(min_value=0, max_value=50))
def test_every_delivery_is_settled_once(plan: tuple[int, list[tuple[int, bool, bool]]], tag_base: int) -> None:
    n, events = plan
    d = parse_shovel("ledger", {"src-uri": "amqp://", "src-queue": "s", "dest-uri": "amqp://", "dest-queue": "d",
                                "src-delete-after": 1000})
    w = ShovelWorker(d, "/", "guest", "node", open_local=None, on_done=lambda _w: None)  # type: ignore[arg-type]
    src, dest = FakeSource(), FakeDest()
    w._src, w._dest = src, dest  # type: ignore[assignment]  # fakes with the methods the ledger uses
    tags = [tag_base + i + 1 for i in range(n)]
    for tag in tags:
        src.outstanding.add(tag)
        w._on_delivery(tag, False, "", "s", b"\x00\x00", b"body")
    assert dest.published == [("", "d")] * n
    nacked_seqs: set[int] = set()
    confirmed: set[int] = set()
    for seq, multiple, ack in events:
        covered = {s for s in range(1, seq + 1) if s not in confirmed} if multiple else {seq}
        confirmed |= covered
        if not ack:
            nacked_seqs |= covered
        w._on_confirm(seq, multiple, ack)
    assert not src.outstanding
    assert sorted(src.acked + src.requeued) == tags and not set(src.acked) & set(src.requeued)
    assert sorted(src.requeued) == sorted(tags[s - 1] for s in nacked_seqs)
    assert w.acked == len(src.acked) and w._taken == len(src.acked)
