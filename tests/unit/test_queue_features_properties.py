"""Property: with random mixes of TTLs, length limits, overflow modes, delivery limits and rejections,
every published message ends in exactly one place — acked, dead-lettered (with its reason), dropped,
refused at publish, or still queued (ready or unacked). Pure: a fake clock, no event loop."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from test_classic_queue import FakeChannel

from hutch.amqp.spec import BasicProperties
from hutch.core.message import Message
from hutch.core.queue_settings import QueueSettings
from hutch.core.queue_type import REJECTED, QueueEntry
from hutch.queues.classic.queue import ClassicQueue


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def body(msg: Message) -> int:
    return int(msg.body)


class FeatureMachine(RuleBasedStateMachine):
    @initialize(ttl=st.one_of(st.none(), st.integers(0, 50)),
                max_length=st.one_of(st.none(), st.integers(0, 6)),
                max_bytes=st.one_of(st.none(), st.integers(0, 12)),
                overflow=st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
                dlx=st.booleans(), delivery_limit=st.one_of(st.none(), st.integers(0, 3)))
    def setup(self, ttl: int | None, max_length: int | None, max_bytes: int | None, overflow: str,
              dlx: bool, delivery_limit: int | None) -> None:
        self.clock = Clock()
        ClassicQueue.clock = staticmethod(self.clock)  # type: ignore[assignment]
        self.q = ClassicQueue("/", "q", False, None, False, {})
        self.q.apply_settings(QueueSettings(message_ttl=ttl, max_length=max_length, max_length_bytes=max_bytes,
                                            overflow=overflow, dead_letter_exchange="dlx" if dlx else None,
                                            delivery_limit=delivery_limit))
        self.dead: list[tuple[int, str]] = []
        self.q.dead_letterer = lambda _q, msgs, reason: self.dead.extend((body(m), reason) for m in msgs)
        self.ch = FakeChannel()
        self.next = 0
        self.held: list[QueueEntry] = []
        self.acked: set[int] = set()
        self.refused: set[int] = set()
        self.published: set[int] = set()

    @rule(n=st.integers(1, 4), expiration=st.one_of(st.none(), st.integers(0, 60)))
    def publish(self, n: int, expiration: int | None) -> None:
        props = BasicProperties(expiration=str(expiration)) if expiration is not None else BasicProperties()
        for _ in range(n):
            i = self.next
            self.next += 1
            self.published.add(i)
            if self.q.publish(Message("", "q", props, str(i).encode())) is REJECTED:
                self.refused.add(i)

    @rule(ms=st.integers(0, 40))
    def time_passes(self, ms: int) -> None:
        self.clock.now += ms
        self.q.on_timer(self.clock.now)

    @rule()
    def get(self) -> None:
        e = self.q.get(self.ch, no_ack=False)
        if e is not None:
            assert not e.expires_at_ms or e.expires_at_ms > self.clock.now, "an expired message was served"
            self.held.append(e)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        e = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        self.q.ack([e])
        self.acked.add(body(e.msg))

    @precondition(lambda self: self.held)
    @rule(data=st.data(), requeue=st.booleans())
    def reject(self, data: st.DataObject, requeue: bool) -> None:
        e = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        if requeue:
            self.q.requeue([e])
        else:
            self.q.discard([e])

    @rule(limit=st.one_of(st.none(), st.integers(0, 4)))
    def policy_changes_the_limit(self, limit: int | None) -> None:
        self.q.apply_settings(replace(self.q.settings, max_length=limit))

    @invariant()
    def every_message_is_in_exactly_one_place(self) -> None:
        q = self.q
        ready = [body(e.msg) for e in q._ready]
        held = [body(e.msg) for e in self.held]
        dead_ids = [i for i, _r in self.dead]
        dropped = self.published - set(ready) - set(held) - self.acked - set(dead_ids) - self.refused
        places = ready + held + sorted(self.acked) + dead_ids + sorted(self.refused - set(dead_ids))
        # nothing is in two places, and what is nowhere was dropped by the queue (no dead-letter exchange)
        assert len(places) == len(set(places)), "a message is in two places"
        assert set(places) | dropped == self.published
        if q.settings.dead_letter_exchange is not None:
            assert not dropped, f"dropped although a dead-letter exchange is set: {sorted(dropped)}"
        refused_and_dropped = (len(self.refused) if q.settings.overflow == "reject-publish-dlx"
                               and q.settings.dead_letter_exchange is None else 0)
        assert q.stat_dropped == len(dropped) + refused_and_dropped
        assert q.unacked_count == len(self.held)
        assert q.message_count == len(ready)

    @invariant()
    def reasons_are_rabbitmqs(self) -> None:
        assert {r for _i, r in self.dead} <= {"expired", "maxlen", "delivery_limit", "rejected"}

    @invariant()
    def limits_hold_for_drop_head(self) -> None:
        s = self.q.settings
        if s.overflow == "drop-head" and s.max_length is not None:
            assert self.q.message_count <= s.max_length


TestFeatureMachine = FeatureMachine.TestCase
TestFeatureMachine.settings = settings(max_examples=75, stateful_step_count=40, derandomize=True, deadline=None)


@pytest.mark.slow  # the long run (`make test-slow`); `make test` runs 75 examples of the same machine
class TestFeatureMachineLong(FeatureMachine.TestCase):
    settings = settings(max_examples=150, stateful_step_count=40, derandomize=True, deadline=None)


def teardown_module() -> None:
    ClassicQueue.clock = staticmethod(lambda: 0)  # type: ignore[assignment]
