"""Scenario tests of the quorum queue state machine (hutch.queues.quorum): pure, no event loop.

Each test names the seed-000 / rabbit_fifo behaviour it checks. `Q` applies commands at consecutive
raft indexes with a settable leader time, the way the Raft driver would.

Message ids are `(raft index << SHIFT) | position` (messages.py): `m(i)` is the id of the message of a
plain enqueue or requeue at raft index i, `m(i, p)` the one at position p of an enqueue batch at i.
The release cursor is a raft index.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import pytest

from hutch.core.queue_settings import QueueSettings
from hutch.queues.quorum import (
    DUPLICATE,
    OK,
    REJECTED,
    CheckoutReply,
    CommandError,
    Confirm,
    ConsumerStatus,
    DeadLetter,
    DeleteQueue,
    Deliver,
    DequeueReply,
    DlxDeliver,
    DlxWorker,
    Dropped,
    Meta,
    OverflowStatus,
    QueueState,
    QuorumConfig,
    QuorumMachine,
    Reject,
    ReleaseCursor,
    apply,
    decode,
    encode,
    leader_effects,
    make_cancel,
    make_checkout,
    make_credit,
    make_dequeue,
    make_discard,
    make_dlx_checkout,
    make_dlx_settle,
    make_down,
    make_enqueue,
    make_enqueue_batch,
    make_purge,
    make_register_publisher,
    make_requeue,
    make_return,
    make_settle,
    make_tick,
    make_touch,
    make_unregister_publisher,
    make_update_config,
    payload_of,
    payloads_of,
)
from hutch.queues.quorum.commands import EnqueueBatch
from hutch.queues.quorum.consumers import UNLIMITED_PREFETCH
from hutch.queues.quorum.messages import BATCH_MAX, SHIFT
from hutch.queues.quorum.state import PUBLISHER_IDLE_MS

DLX = {"dead_letter_exchange": "dlx"}
AT_LEAST_ONCE = {"dead_letter_exchange": "dlx", "dead_letter_strategy": "at-least-once",
                 "overflow": "reject-publish"}


def m(raft_index: int, position: int = 0) -> int:
    """The message id of the message at `position` of the entry at `raft_index`."""
    return (raft_index << SHIFT) | position


def entry(msg_id: int) -> int:
    """The raft index of the entry carrying a message's body."""
    return msg_id >> SHIFT


class Q:
    """A queue replica driven like the Raft driver drives it: one command per raft index."""

    def __init__(self, release_step: int = 10**9, **config: Any) -> None:
        self.st = QueueState(QuorumConfig(**config), release_step)
        self.index = 0
        self.now = 1_000_000
        self.reply: Any = None
        self.effects: list[Any] = []

    def do(self, cmd: Any) -> list[Any]:
        self.index += 1
        _st, self.reply, self.effects = apply(Meta(self.index, 1, self.now), cmd, self.st)
        return self.effects

    def pub(self, n: int = 1, size: int = 10, ttl: int | None = None, publisher: Any = None) -> list[int]:
        """Enqueue n messages, one entry each; their msg ids."""
        ids = []
        for _ in range(n):
            self.do(make_enqueue(publisher, self.index + 1 if publisher else 0, size, ttl))
            ids.append(m(self.index))
        return ids

    def batch(self, sizes: Sequence[int], publisher: Any = None, first_seq: int = 1,
              ttls: Sequence[int | None] | None = None) -> list[int]:
        """Enqueue len(sizes) messages in one EnqueueBatch entry (message p's payload: the byte p); the
        msg ids of its positions, whether or not each was enqueued."""
        n = len(sizes)
        self.do(make_enqueue_batch(publisher, first_seq, sizes, ttls, [1] * n, bytes(range(n))))
        return [m(self.index, p) for p in range(n)]

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.effects if isinstance(e, kind)]

    def delivered(self, key: Any = None) -> list[int]:
        return [m[0] for e in self.of(Deliver) if key is None or e.consumer_key == key for m in e.messages]


# -- publishing -----------------------------------------------------------------------------------------
def test_enqueue_is_confirmed_once_applied_and_keeps_only_a_record() -> None:
    q = Q()
    assert q.do(make_enqueue("p1", 1, 100, payload=b"x" * 100)) == [Confirm("p1", (1,))]
    assert q.reply == OK
    assert q.st.ready_count() == 1 and q.st.ready_bytes == 100
    assert list(q.st.messages.records()) == [(m(1), 100, 0, 0)]  # (msg id, size, expiry, count): no body


def test_resend_of_an_applied_seq_is_confirmed_again_but_not_enqueued_twice() -> None:
    q = Q()
    q.do(make_enqueue("p1", 1, 10))
    q.do(make_enqueue("p1", 2, 10))
    assert q.do(make_enqueue("p1", 2, 10)) == [Confirm("p1", (2,))]  # after a leader change
    assert q.reply == DUPLICATE
    q.do(make_enqueue("p1", 1, 10))
    assert q.reply == DUPLICATE
    assert q.st.ready_count() == 2


def test_a_seq_overtaken_on_the_way_is_enqueued_when_it_arrives_and_deduplicated_after() -> None:
    q = Q()
    q.do(make_enqueue("p1", 1, 10))
    q.do(make_enqueue("p1", 4, 10))  # 2 and 3 were lost with a leader, or are still on the way
    assert q.reply == OK
    assert q.do(make_enqueue("p1", 3, 10)) == [Confirm("p1", (3,))]
    assert q.reply == OK  # a resend filling the gap: new
    q.do(make_enqueue("p1", 2, 10))
    assert q.reply == OK
    for seq in (1, 2, 3, 4):
        q.do(make_enqueue("p1", seq, 10))
        assert q.reply == DUPLICATE
    assert q.st.ready_count() == 4
    assert q.st.publishers["p1"].missing == []


def test_the_gap_record_survives_a_snapshot() -> None:
    q = Q()
    q.do(make_enqueue("p1", 3, 10))  # 1 and 2 not seen yet
    restored = QueueState.restore(q.st.snapshot())
    assert restored.publishers["p1"].missing == [[1, 2]]


def test_untracked_enqueue_gets_no_confirm_and_no_dedup() -> None:
    q = Q()
    assert q.do(make_enqueue(None, 0, 10)) == []
    assert q.do(make_enqueue(None, 0, 10)) == []
    assert q.st.ready_count() == 2 and not q.st.publishers


def test_publishers_table_is_cleaned_by_unregister_down_and_idleness() -> None:
    q = Q()
    q.do(make_register_publisher("ch1", "node-a"))
    q.do(make_enqueue("ch1", 5, 10))
    q.do(make_unregister_publisher("ch1"))
    assert "ch1" not in q.st.publishers
    q.do(make_enqueue("ch1", 5, 10))  # a new publisher with that id starts afresh
    assert q.reply == OK

    q.do(make_register_publisher("ch2", "node-b"))
    q.do(make_down("node-b", "noconnection"))  # maybe alive behind a partition: kept for dedup
    assert "ch2" in q.st.publishers
    q.do(make_down("node-b"))
    assert "ch2" not in q.st.publishers
    q.do(make_down("ch1"))
    assert not q.st.publishers

    q.do(make_enqueue("ch3", 1, 10))
    q.now += PUBLISHER_IDLE_MS - 1
    q.do(make_tick(q.now))
    assert "ch3" in q.st.publishers
    q.now += 1
    q.do(make_tick(q.now))
    assert "ch3" not in q.st.publishers


# -- consumers ------------------------------------------------------------------------------------------
def test_single_consumer_gets_messages_in_fifo_order() -> None:
    q = Q()
    ids = q.pub(5)
    q.do(make_checkout("c", 10))
    assert q.delivered("c") == ids
    assert q.of(Deliver)[0].messages[0] == (ids[0], ids[0], False, 0)
    assert isinstance(q.reply, CheckoutReply) and q.reply.active and q.reply.ready == 0
    assert q.st.unacked_count() == 5


def test_prefetch_bounds_unacked_and_settle_gives_credit_back() -> None:
    q = Q()
    ids = q.pub(5)
    q.do(make_checkout("c", 2))
    assert q.delivered() == ids[:2]
    q.do(make_settle("c", [ids[0]]))
    assert q.delivered() == [ids[2]]
    q.do(make_settle("c", [ids[0]]))  # already settled: ignored
    assert q.delivered() == []
    assert q.st.ready_count() == 2 and q.st.unacked_count() == 2


def test_prefetch_zero_means_rabbitmqs_unlimited_prefetch_count() -> None:
    q = Q()
    q.pub(UNLIMITED_PREFETCH + 5)
    q.do(make_checkout("c", 0))
    assert len(q.delivered()) == UNLIMITED_PREFETCH


def test_equal_priority_consumers_are_served_round_robin() -> None:
    q = Q()
    q.do(make_checkout("a", 10))
    q.do(make_checkout("b", 10))
    got = []
    for _ in range(4):
        q.pub(1)
        got.append(q.of(Deliver)[0].consumer_key)
    assert got == ["a", "b", "a", "b"]


def test_higher_priority_consumer_gets_messages_while_it_has_credit() -> None:
    q = Q()
    q.do(make_checkout("low", 10, priority=0))
    q.do(make_checkout("high", 2, priority=5))
    ids = q.pub(3)
    assert [e.consumer_key for e in q.of(Deliver)] == ["low"]  # the last one only
    assert q.st.checked_out("high") == ids[:2] and q.st.checked_out("low") == ids[2:]
    q.do(make_settle("high", [ids[0]]))
    q.pub(1)
    assert q.of(Deliver)[0].consumer_key == "high"


def test_auto_ack_consumer_spends_credit_and_gets_more_by_credit_command() -> None:
    q = Q()
    ids = q.pub(5)
    q.do(make_checkout("c", 2, auto_ack=True))
    assert q.delivered() == ids[:2]
    assert q.st.unacked_count() == 0 and q.st.message_count() == 3  # settled at once
    q.do(make_credit("c", 2))
    assert q.delivered() == ids[2:4]


def test_cancel_stops_deliveries_but_unacked_messages_stay_until_settled() -> None:
    q = Q()
    ids = q.pub(3)
    q.do(make_checkout("c", 2))
    q.do(make_cancel("c"))
    assert q.st.consumer_count() == 0 and q.st.unacked_count() == 2
    q.pub(1)
    assert q.delivered() == []
    q.do(make_settle("c", ids[:2]))
    assert q.st.consumers.get("c") is None and q.st.ready_count() == 2


def test_reconsume_with_same_key_updates_prefetch() -> None:
    q = Q()
    ids = q.pub(4)
    q.do(make_checkout("c", 1))
    q.do(make_checkout("c", 3))
    assert q.delivered() == ids[1:3]
    assert q.st.consumers.get("c").credit == 0


# -- returns, delivery limit, poison messages ----------------------------------------------------------
def test_without_delivery_limit_a_returned_message_goes_to_the_back_with_its_count() -> None:
    q = Q()
    ids = q.pub(3)
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [ids[0]]))
    assert q.delivered() == [ids[1]]
    assert q.st.ready_indexes() == [ids[2], ids[0]]
    q.do(make_settle("c", [ids[1]]))
    q.do(make_settle("c", [ids[2]]))
    assert q.of(Deliver)[0].messages == ((ids[0], ids[0], True, 1),)  # x-delivery-count 1, redelivered


def test_with_delivery_limit_a_returned_message_is_delivered_first() -> None:
    q = Q(delivery_limit=5)
    ids = q.pub(3)
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [ids[0]]))
    assert q.of(Deliver)[0].messages == ((ids[0], ids[0], True, 1),)


@pytest.mark.parametrize("dlx", [True, False])
def test_past_the_delivery_limit_a_message_is_dead_lettered_or_dropped(dlx: bool) -> None:
    q = Q(delivery_limit=1, **(DLX if dlx else {}))
    (msg,) = q.pub(1)
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [msg]))
    assert q.of(Deliver)[0].messages == ((msg, msg, True, 1),)
    q.do(make_return("c", [msg]))
    kind = DeadLetter if dlx else Dropped
    assert q.of(kind) == [kind("delivery_limit", (msg,))]
    assert q.st.message_count() == 0


def test_delivery_limit_zero_kills_a_message_on_its_first_return() -> None:
    q = Q(delivery_limit=0)
    (msg,) = q.pub(1)
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [msg]))
    assert q.of(Dropped) == [Dropped("delivery_limit", (msg,))]


def test_consumer_down_returns_unacked_messages_as_failed_deliveries() -> None:
    q = Q()
    ids = q.pub(2)
    q.do(make_checkout("c1", 10, channel="ch1", node="n1"))
    q.do(make_checkout("c2", 10, channel="ch2", node="n2"))
    q.do(make_down("ch1"))
    assert q.st.consumers.get("c1") is None
    assert q.of(Deliver) == [Deliver("c2", ((ids[0], ids[0], True, 1), (ids[1], ids[1], True, 1)))]
    q.do(make_down("n2"))
    assert q.st.consumer_count() == 0 and q.st.ready_count() == 2


def test_down_of_a_node_removes_all_its_consumers_and_the_limit_applies() -> None:
    q = Q(delivery_limit=0, **DLX)
    ids = q.pub(2)
    q.do(make_checkout("c1", 1, node="n1"))
    q.do(make_checkout("c2", 1, node="n1"))
    q.do(make_down("n1", "noconnection"))
    assert q.of(DeadLetter) == [DeadLetter("delivery_limit", tuple(ids))]
    assert q.st.consumers.by_key == {}


def test_requeue_moves_the_message_to_a_new_entry_so_the_old_can_be_truncated() -> None:
    q = Q()
    ids = q.pub(2)
    q.do(make_checkout("c", 1))
    assert q.st.release_cursor() == entry(ids[0])
    q.do(make_requeue("c", ids[0], b"body"))
    new = m(q.index)
    assert q.delivered() == [ids[1]]
    assert q.st.ready_indexes() == [new]
    assert q.st.release_cursor() == entry(ids[1])
    q.do(make_settle("c", [ids[1]]))
    assert q.of(Deliver)[0].messages == ((new, new, True, 1),)


@pytest.mark.parametrize("dlx", [True, False])
def test_discard_dead_letters_rejected_or_drops(dlx: bool) -> None:
    q = Q(**(DLX if dlx else {}))
    (msg,) = q.pub(1)
    q.do(make_checkout("c", 1))
    q.do(make_discard("c", [msg]))
    kind = DeadLetter if dlx else Dropped
    assert q.of(kind) == [kind("rejected", (msg,))]
    assert q.st.message_count() == 0


def test_settlements_from_unknown_consumers_or_ids_are_ignored() -> None:
    q = Q()
    (msg,) = q.pub(1)
    assert q.do(make_settle("nobody", [msg])) == []
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [msg + 100, m(100)]))  # no message at that position / at that entry
    q.do(make_discard("other", [msg]))
    assert q.st.unacked_count() == 1


# -- single active consumer -----------------------------------------------------------------------------
def test_single_active_consumer_one_active_the_rest_wait() -> None:
    q = Q(single_active_consumer=True)
    q.do(make_checkout("a", 10))
    assert q.of(ConsumerStatus) == [ConsumerStatus("a", True)]
    q.do(make_checkout("b", 10, priority=1))
    assert q.of(ConsumerStatus) == [ConsumerStatus("b", False)] and q.reply.active is False
    q.do(make_checkout("c", 10, priority=3))
    ids = q.pub(2)
    assert q.st.checked_out("a") == ids
    q.do(make_cancel("a"))  # the waiting consumer with the highest priority takes over
    assert q.of(ConsumerStatus) == [ConsumerStatus("c", True)]
    q.pub(1)
    assert q.delivered() == [m(q.index)] and q.of(Deliver)[0].consumer_key == "c"
    q.do(make_down("a"))  # a's unacked messages go to the active consumer
    assert q.delivered("c") == ids


def test_single_active_consumer_switched_by_config_takes_effect_at_once() -> None:
    q = Q()
    q.do(make_checkout("a", 10))
    q.do(make_checkout("b", 10))
    q.do(make_update_config(QuorumConfig(single_active_consumer=True)))
    assert q.of(ConsumerStatus) == [ConsumerStatus("a", True), ConsumerStatus("b", False)]
    ids = q.pub(2)
    assert q.st.checked_out("a") == ids
    q.do(make_update_config(QuorumConfig()))
    assert q.of(ConsumerStatus) == [ConsumerStatus("b", True)]
    q.pub(1)
    q.pub(1)
    assert q.of(Deliver)[0].consumer_key == "b"  # round robin again


# -- basic.get ------------------------------------------------------------------------------------------
def test_dequeue_settled_unsettled_and_empty() -> None:
    q = Q()
    assert q.do(make_dequeue("g", True)) == [] and q.reply == DequeueReply(None, 0)
    ids = q.pub(3)
    q.do(make_dequeue("g", True))
    assert q.reply == DequeueReply((ids[0], ids[0], False, 0), 2)
    assert q.st.message_count() == 2
    q.do(make_dequeue(("ch", "get"), False, channel="ch"))
    assert q.reply.message[0] == ids[1] and q.st.unacked_count() == 1
    assert q.st.consumer_count() == 0  # a get holder is not a consumer
    q.do(make_return(("ch", "get"), [ids[1]]))
    assert q.st.consumers.get(("ch", "get")) is None
    q.do(make_dequeue(("ch", "get"), False, channel="ch"))
    q.do(make_dequeue(("ch", "get"), False, channel="ch"))
    assert q.reply == DequeueReply((ids[1], ids[1], True, 1), 0)
    q.do(make_down("ch"))
    assert q.st.ready_count() == 2


# -- TTL ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dlx", [True, False])
def test_message_ttl_expires_at_the_head_on_any_command(dlx: bool) -> None:
    q = Q(message_ttl_ms=100, **(DLX if dlx else {}))
    ids = q.pub(2)
    q.now += 99
    q.do(make_touch())
    assert q.st.ready_count() == 2
    q.now += 1
    q.do(make_touch())
    kind = DeadLetter if dlx else Dropped
    assert q.of(kind) == [kind("expired", tuple(ids))]


def test_per_message_ttl_and_queue_ttl_the_smaller_applies() -> None:
    q = Q(message_ttl_ms=1000)
    (short,) = q.pub(1, ttl=10)
    (long,) = q.pub(1, ttl=5000)
    assert [r[2] for r in q.st.messages.records()] == [q.now + 10, q.now + 1000]
    q.now += 10
    q.do(make_tick(q.now))
    assert q.of(Dropped) == [Dropped("expired", (short,))]
    q.now += 990
    q.do(make_tick(q.now))
    assert q.of(Dropped) == [Dropped("expired", (long,))]


def test_expiry_looks_at_the_head_only_but_never_delivers_an_expired_message() -> None:
    q = Q()
    (first,) = q.pub(1, ttl=1000)
    (second,) = q.pub(1, ttl=10)
    q.now += 20
    q.do(make_tick(q.now))
    assert q.st.ready_count() == 2  # the short-lived one waits behind the long-lived head
    q.do(make_checkout("c", 10))
    assert q.delivered() == [first] and q.of(Dropped) == [Dropped("expired", (second,))]


def test_a_message_expires_at_exactly_its_ttl_even_behind_the_head() -> None:
    q = Q()
    (first,) = q.pub(1)
    (second,) = q.pub(1, ttl=10)
    q.now += 10
    q.do(make_checkout("c", 10))
    assert q.delivered() == [first] and q.of(Dropped) == [Dropped("expired", (second,))]


def test_ttl_zero_is_delivered_to_a_ready_consumer_else_expires_at_once() -> None:
    q = Q(message_ttl_ms=0)
    (msg,) = q.pub(1)
    assert q.of(Dropped) == [Dropped("expired", (msg,))]
    q.do(make_checkout("c", 10))
    (msg,) = q.pub(1)
    assert q.delivered() == [msg]


def test_expired_returned_message_is_not_redelivered() -> None:
    q = Q(message_ttl_ms=50, delivery_limit=10)
    (msg,) = q.pub(1)
    q.do(make_checkout("c", 1))
    q.now += 60
    q.do(make_return("c", [msg]))
    assert q.delivered() == [] and q.of(Dropped) == [Dropped("expired", (msg,))]


def test_a_requeued_message_past_its_expiry_is_not_delivered_again() -> None:
    q = Q(message_ttl_ms=50)
    ids = q.pub(2)
    q.do(make_checkout("c", 1))
    q.now += 60
    q.do(make_requeue("c", ids[0], b"body"))
    assert q.delivered() == [] and q.of(Dropped) == [Dropped("expired", (ids[1], m(q.index)))]


def test_queue_ttl_emits_delete_when_unused_for_that_long() -> None:
    q = Q(expires_ms=1000)
    q.do(make_touch())
    q.now += 999
    assert q.do(make_tick(q.now)) == []
    q.now += 1
    assert q.do(make_tick(q.now)) == [DeleteQueue("expires")]
    assert q.do(make_tick(q.now)) == [DeleteQueue("expires")]  # repeated while it holds
    q.do(make_touch())  # redeclared
    assert q.do(make_tick(q.now)) == []
    q.do(make_checkout("c", 1))
    q.now += 5000
    assert q.do(make_tick(q.now)) == []  # a consumer keeps it in use
    q.do(make_cancel("c"))
    q.now += 1000
    assert q.do(make_tick(q.now)) == [DeleteQueue("expires")]


def test_queue_ttl_is_not_reset_by_publishing() -> None:
    q = Q(expires_ms=1000)
    q.pub(1)
    q.now += 1000
    q.pub(1)
    assert q.do(make_tick(q.now)) == [DeleteQueue("expires")]


# -- length limits --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dlx", [True, False])
def test_max_length_drop_head_drops_or_dead_letters_the_oldest(dlx: bool) -> None:
    q = Q(max_length=2, **(DLX if dlx else {}))
    ids = q.pub(3)
    kind = DeadLetter if dlx else Dropped
    assert q.of(kind) == [kind("maxlen", (ids[0],))]
    assert q.st.ready_indexes() == ids[1:]


def test_max_length_bytes_drop_head() -> None:
    q = Q(max_length_bytes=25)
    ids = q.pub(3, size=10)
    assert q.of(Dropped) == [Dropped("maxlen", (ids[0],))] and q.st.ready_bytes == 20


def test_max_length_counts_ready_messages_only_and_consumers_come_first() -> None:
    q = Q(max_length=0)
    q.do(make_checkout("c", 2))
    ids = q.pub(3)
    assert q.st.checked_out("c") == ids[:2]
    assert q.of(Dropped) == [Dropped("maxlen", (ids[2],))]


def test_lowering_max_length_by_policy_applies_at_once() -> None:
    q = Q()
    ids = q.pub(5)
    q.do(make_update_config(QuorumConfig(max_length=2)))
    assert q.of(Dropped) == [Dropped("maxlen", tuple(ids[:3]))]


def test_reject_publish_refuses_at_the_limit_and_tells_channels() -> None:
    q = Q(max_length=2, overflow="reject-publish")
    q.do(make_enqueue("p", 1, 10))
    q.do(make_enqueue("p", 2, 10))
    assert q.of(OverflowStatus) == [OverflowStatus(True)]
    assert q.do(make_enqueue("p", 3, 10)) == [Reject("p", (3,))] and q.reply == REJECTED
    assert q.do(make_enqueue("p", 3, 10)) == [Reject("p", (3,))]  # a resend is refused again, never acked
    assert q.st.ready_count() == 2  # never overshot
    q.do(make_checkout("c", 10))
    assert q.of(OverflowStatus) == [OverflowStatus(False)]
    q.do(make_enqueue("p", 4, 10))
    assert q.reply == OK
    q.do(make_enqueue("p", 2, 10))
    assert q.reply == DUPLICATE  # seq 2 was accepted: confirmed again


def test_reject_publish_by_bytes() -> None:
    q = Q(max_length_bytes=25, overflow="reject-publish")
    q.do(make_enqueue("p", 1, 10))
    q.do(make_enqueue("p", 2, 10))
    assert q.do(make_enqueue("p", 3, 10)) == [Reject("p", (3,))]
    q.do(make_enqueue("p", 4, 5))
    assert q.reply == OK


def test_reject_publish_dlx_is_not_supported() -> None:
    with pytest.raises(ValueError):
        QuorumConfig(overflow="reject-publish-dlx")
    with pytest.raises(ValueError):
        QuorumConfig.from_settings(QueueSettings(overflow="reject-publish-dlx"))


def test_in_memory_limits_are_accepted_and_have_no_effect() -> None:
    q = Q(max_in_memory_length=0, max_in_memory_bytes=0)
    q.pub(3)
    assert q.st.ready_count() == 3


# -- at-least-once dead-lettering ----------------------------------------------------------------------
def test_at_least_once_keeps_dead_letters_until_the_worker_settles_them() -> None:
    q = Q(delivery_limit=0, **AT_LEAST_ONCE)
    ids = q.pub(3)
    q.do(make_checkout("c", 10))
    q.do(make_discard("c", ids))
    assert q.of(DeadLetter) == [] and q.st.dlx_count() == 3 and q.st.message_count() == 3
    assert q.st.release_cursor() == entry(ids[0])
    q.do(make_dlx_checkout(2))
    assert q.of(DlxDeliver) == [DlxDeliver(((ids[0], ids[0], "rejected"), (ids[1], ids[1], "rejected")))]
    q.do(make_dlx_settle([ids[0]]))
    assert q.of(DlxDeliver) == [DlxDeliver(((ids[2], ids[2], "rejected"),))]
    q.do(make_dlx_settle([ids[1], ids[2]]))
    assert q.st.message_count() == 0 and q.st.release_cursor() == q.index


def test_at_least_once_dead_letters_count_towards_the_length_limit() -> None:
    q = Q(max_length=2, **AT_LEAST_ONCE)
    ids = q.pub(2, publisher="p")
    q.do(make_checkout("c", 10))
    q.do(make_discard("c", ids))
    assert q.st.ready_count() == 0 and q.st.dlx_count() == 2
    assert q.do(make_enqueue("p", 99, 10)) == [Reject("p", (99,))]


def test_new_dlx_worker_gets_back_what_the_old_one_did_not_settle() -> None:
    q = Q(message_ttl_ms=10, **AT_LEAST_ONCE)
    ids = q.pub(3)
    q.do(make_dlx_checkout(32))
    q.now += 10
    q.do(make_tick(q.now))
    assert [m[0] for e in q.of(DlxDeliver) for m in e.messages] == ids
    assert [m[2] for e in q.of(DlxDeliver) for m in e.messages] == ["expired"] * 3
    q.do(make_dlx_settle([ids[1]]))
    q.do(make_dlx_checkout(32))  # leader change: a new worker
    assert q.of(DlxDeliver) == [DlxDeliver(((ids[0], ids[0], "expired"), (ids[2], ids[2], "expired")))]


def test_at_least_once_needs_reject_publish_else_at_most_once() -> None:
    q = Q(dead_letter_exchange="dlx", dead_letter_strategy="at-least-once", delivery_limit=0)
    (msg,) = q.pub(1)
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [msg]))
    assert q.of(DeadLetter) == [DeadLetter("delivery_limit", (msg,))] and q.st.dlx_count() == 0


def test_switching_away_from_at_least_once_deletes_unconfirmed_dead_letters() -> None:
    q = Q(**AT_LEAST_ONCE)
    ids = q.pub(3)
    q.do(make_checkout("c", 10))
    q.do(make_discard("c", ids))
    q.do(make_dlx_checkout(1))
    q.do(make_update_config(QuorumConfig(dead_letter_exchange="dlx", overflow="drop-head",
                                         dead_letter_strategy="at-least-once")))
    assert q.of(Dropped) == [Dropped("dead_letter_strategy_changed", (ids[1], ids[2], ids[0]))]
    assert DlxWorker(False) in q.effects
    assert q.st.message_count() == 0 and q.st.dlx.prefetch == 0
    q.do(make_update_config(QuorumConfig(**AT_LEAST_ONCE)))
    assert q.effects == [DlxWorker(True)]


# -- purge, counts, release cursor ---------------------------------------------------------------------
def test_purge_removes_ready_messages_only() -> None:
    q = Q(delivery_limit=5)
    ids = q.pub(4)
    q.do(make_checkout("c", 2))
    q.do(make_return("c", [ids[0]]))  # back in returns, redelivered at once
    q.do(make_cancel("c"))
    q.do(make_purge())
    assert q.reply == 2 and q.st.ready_count() == 0 and q.st.unacked_count() == 2
    assert q.st.ready_bytes == 0


def test_overview_counts() -> None:
    q = Q()
    q.pub(3, size=7)
    q.do(make_checkout("c", 1))
    o = q.st.overview()
    assert (o["messages_ready"], o["messages_unacknowledged"], o["messages"], o["consumers"]) == (2, 1, 3, 1)
    assert (o["message_bytes_ready"], o["message_bytes_unacknowledged"]) == (14, 7)


def test_release_cursor_is_the_oldest_live_entry_or_the_current_index() -> None:
    q = Q(release_step=3)
    assert q.st.release_cursor() == 0
    ids = q.pub(3)
    q.do(make_checkout("c", 10))
    assert q.st.release_cursor() == entry(ids[0]) == 1
    q.do(make_settle("c", [ids[1], ids[2]]))
    assert q.st.release_cursor() == entry(ids[0])  # a stuck unacked message holds the log
    q.do(make_settle("c", [ids[0]]))
    assert q.st.release_cursor() == q.index
    assert q.of(ReleaseCursor) == [ReleaseCursor(q.index)]
    q.do(make_touch())
    assert q.of(ReleaseCursor) == []  # moved by 1 < step
    q.do(make_touch())
    q.do(make_touch())
    assert q.of(ReleaseCursor) == [ReleaseCursor(q.index)]


def test_release_cursor_survives_a_long_gap() -> None:
    q = Q()
    (stuck,) = q.pub(1)
    q.do(make_checkout("c", 0))
    for _ in range(10_000):
        (msg,) = q.pub(1)
        q.do(make_settle("c", [msg]))
    assert q.st.release_cursor() == entry(stuck)
    q.do(make_settle("c", [stuck]))
    assert q.st.release_cursor() == q.index
    assert q.st.live.nbytes() < 200  # the map was cut down


# -- leader change, adapter, codec ---------------------------------------------------------------------
def test_leader_effects_redeliver_checked_out_messages_with_stable_ids() -> None:
    q = Q(max_length=1, overflow="reject-publish", **{"dead_letter_exchange": "dlx",
                                                     "dead_letter_strategy": "at-least-once"})
    (msg,) = q.pub(1)
    q.do(make_checkout("c", 1))
    q.do(make_return("c", [msg]))
    effects = leader_effects(q.st)
    assert effects[0] == Deliver("c", ((msg, msg, True, 1),))
    assert DlxWorker(True) in effects and ReleaseCursor(entry(msg)) in effects


def _all_commands() -> list[Any]:
    return [
        make_enqueue("p", 1, 10, 500, b"payload"), make_enqueue(None, 0, 3), make_enqueue(("n", 7), 2, 1),
        make_register_publisher("p", "n1"), make_unregister_publisher(("n", 7)),
        make_checkout(("ch", "tag"), 10, False, -3, "tag", "n1", "ch"), make_cancel("c"),
        make_settle("c", [1, 2]), make_return("c", (3,)), make_discard("c", []), make_requeue("c", 4, b"b"),
        make_credit("c", 5), make_down("n1", "noconnection"), make_dequeue("g", True, "n", "ch"),
        make_purge(), make_touch(), make_tick(123), make_update_config(QuorumConfig(**AT_LEAST_ONCE)),
        make_dlx_checkout(), make_dlx_settle([9]),
        make_enqueue_batch("p", 3, [10, 0, 7], [None, 0, 500], [2, 0, 3], b"abxyz"),
        make_enqueue_batch(None, 0, [1], None, [0], b""),
        make_enqueue_batch(("n", 7), 9, [1, 2], None, [1, 1], b"ab"),
    ]


@pytest.mark.parametrize("cmd", _all_commands(), ids=lambda c: type(c).__name__)
def test_codec_round_trips_every_command(cmd: Any) -> None:
    data = encode(cmd, 42)
    assert data[0] == 1  # the version
    t, back = decode(data)
    assert t == 42 and back == cmd and type(back) is type(cmd)


def test_codec_payload_is_not_copied_and_readable_by_the_runtime() -> None:
    data = encode(make_enqueue("p", 1, 4, None, b"body"), 1)
    assert bytes(payload_of(data)) == b"body"
    _t, cmd = decode(data)
    assert isinstance(cmd.payload, memoryview) and cmd.payload.obj is data
    assert len(encode(make_settle("c", [1]))) < 16


def test_codec_opcodes_are_never_reused() -> None:
    """The opcode is in every log entry: a new command takes the next one, the old ones keep theirs."""
    ops = {}
    for cmd in _all_commands():
        data = encode(cmd)
        length = int.from_bytes(data[1:5], "big")
        ops[type(cmd).__name__] = msgpack.unpackb(data[5:5 + length])[1]
    assert ops == {"Enqueue": 0, "RegisterPublisher": 1, "UnregisterPublisher": 2, "Checkout": 3,
                   "Cancel": 4, "Settle": 5, "Return": 6, "Discard": 7, "Requeue": 8, "Credit": 9, "Down": 10,
                   "Dequeue": 11, "Purge": 12, "Touch": 13, "Tick": 14, "UpdateConfig": 15, "DlxCheckout": 16,
                   "DlxSettle": 17, "EnqueueBatch": 18}


def test_codec_batch_round_trip_and_payloads_of_slices_without_copying() -> None:
    cmd = make_enqueue_batch("p", 7, [100, 0, 5], [None, 0, 30], [3, 0, 5], b"abcdefgh")
    assert type(cmd) is EnqueueBatch and cmd.sizes == (100, 0, 5) and cmd.ttls == (None, 0, 30)
    data = encode(cmd, 5)
    t, back = decode(data)
    assert t == 5 and back == cmd and isinstance(back.payload, memoryview) and back.payload.obj is data
    parts = payloads_of(data)
    assert [bytes(p) for p in parts] == [b"abc", b"", b"defgh"]
    assert all(isinstance(p, memoryview) and p.obj is data for p in parts)
    untracked = encode(make_enqueue_batch(None, 0, [1, 2], None, [2, 2], b"wxyz"))
    assert [bytes(p) for p in payloads_of(untracked)] == [b"wx", b"yz"]
    assert [bytes(p) for p in payloads_of(encode(make_enqueue("p", 1, 4, None, b"body")))] == [b"body"]
    assert [bytes(p) for p in payloads_of(encode(make_requeue("c", m(3, 2), b"again")))] == [b"again"]
    with pytest.raises(CommandError):
        payloads_of(encode(make_settle("c", [1])))


def test_make_enqueue_batch_refuses_bad_batches() -> None:
    ok = make_enqueue_batch("p", 1, [1] * BATCH_MAX, None, [1] * BATCH_MAX, bytes(BATCH_MAX))
    assert len(ok.sizes) == BATCH_MAX
    assert make_enqueue_batch(None, 0, [1], None, [1], b"x").first_seq == 0  # untracked: seq ignored
    assert make_enqueue_batch("p", 1, [1, 1], [None, None], [1, 1], b"xy").ttls == (None, None)
    for bad in (lambda: make_enqueue_batch("p", 1, [], None, [], b""),  # no message
                lambda: make_enqueue_batch("p", 1, [1] * (BATCH_MAX + 1), None, [1] * (BATCH_MAX + 1),
                                           bytes(BATCH_MAX + 1)),  # too many
                lambda: make_enqueue_batch("p", 1, [1, 1], None, [2], b"xy"),  # lens shorter than sizes
                lambda: make_enqueue_batch("p", 1, [1], None, [1, 0], b"x"),  # lens longer
                lambda: make_enqueue_batch("p", 1, [1, 1], [5], [1, 1], b"xy"),  # ttls shorter
                lambda: make_enqueue_batch("p", 1, [1, 1], [5, 5, 5], [1, 1], b"xy"),  # ttls longer
                lambda: make_enqueue_batch("p", 1, [1, 1], None, [1, 1], b"xyz"),  # lens sum 2, payload 3
                lambda: make_enqueue_batch("p", 1, [1, 1], None, [2, 2], b"xyz"),  # lens sum 4, payload 3
                lambda: make_enqueue_batch("p", 0, [1], None, [1], b"x"),  # seqs start at 1
                lambda: make_enqueue_batch("p", -3, [1], None, [1], b"x"),
                lambda: make_enqueue_batch("p", True, [1], None, [1], b"x"),
                lambda: make_enqueue_batch("p", 1.0, [1], None, [1], b"x"),
                lambda: make_enqueue_batch("p", "1", [1], None, [1], b"x"),
                lambda: make_enqueue_batch("p", 1, [-1], None, [1], b"x"),  # sizes
                lambda: make_enqueue_batch("p", 1, [2**32], None, [1], b"x"),
                lambda: make_enqueue_batch("p", 1, [1], None, [-1], b""),  # lens
                lambda: make_enqueue_batch("p", 1, [1], [-1], [1], b"x"),  # ttls
                lambda: make_enqueue_batch("p", 1, [1], ["5"], [1], b"x"),
                lambda: make_enqueue_batch(["list"], 1, [1], None, [1], b"x")):  # publisher id
        with pytest.raises(CommandError):
            bad()


def test_codec_refuses_unknown_versions_and_garbage() -> None:
    data = bytearray(encode(make_touch()))
    data[0] = 9
    with pytest.raises(CommandError):
        decode(bytes(data))
    for junk in (b"", b"\x01", b"\x01\x00\x00\x00\x09abc", b"\x01\x00\x00\x00\x02\x92\x00"):
        with pytest.raises(CommandError):
            decode(junk)


def test_constructors_refuse_bad_arguments() -> None:
    for bad in (lambda: make_enqueue("p", 0, 1), lambda: make_enqueue("p", 1, -1),
                lambda: make_enqueue("p", 1, 2**32), lambda: make_enqueue(["list"], 1, 1),
                lambda: make_checkout("c", -1), lambda: make_settle("c", ["x"]),
                lambda: make_down("n", "why"), lambda: make_dlx_checkout(0), lambda: make_tick(-1),
                lambda: make_enqueue("p", True, 1), lambda: make_update_config({})):
        with pytest.raises(CommandError):
            bad()


def test_quorum_machine_is_a_raft_state_machine() -> None:
    seen: list[Any] = []
    machine = QuorumMachine(QuorumConfig(), effects_sink=seen.extend)
    assert machine.apply(1, encode(make_enqueue("p", 1, 5, None, b"hello"), 1000)) == OK
    assert seen == [Confirm("p", (1,))]
    assert isinstance(machine.apply(2, encode(make_checkout("c", 1), 1001)), CheckoutReply)
    snap = machine.snapshot()
    other = QuorumMachine()
    other.restore(snap)
    assert other.snapshot() == snap and other.state.checked_out("c") == [m(1)]
    assert other.leader_effects()[0] == Deliver("c", ((m(1), m(1), False, 0),))


def test_config_from_settings_reads_quorum_only_keys() -> None:
    s = QueueSettings(message_ttl=5, max_length=3, overflow="reject-publish", dead_letter_exchange="x",
                      delivery_limit=2, single_active_consumer=True,
                      effective_policy_definition={"dead-letter-strategy": "at-least-once"})
    cfg = QuorumConfig.from_settings(s, {"x-max-in-memory-length": 7})
    assert cfg.at_least_once and cfg.message_ttl_ms == 5 and cfg.max_in_memory_length == 7
    assert QuorumConfig.from_wire(cfg.to_wire()) == cfg
    assert QuorumConfig().to_wire() == {}


def test_snapshot_restores_an_equal_state() -> None:
    q = Q(delivery_limit=3, message_ttl_ms=10_000, **AT_LEAST_ONCE)
    ids = q.pub(6, publisher="p")
    q.do(make_checkout("c", 2, priority=2))
    q.do(make_checkout(("x", 1), 1))
    q.do(make_return("c", [ids[0]]))
    q.do(make_discard(("x", 1), [ids[2]]))
    q.do(make_dlx_checkout(1))
    snap = q.st.snapshot()
    back = QueueState.restore(snap)
    assert back.snapshot() == snap
    assert back.live_indexes() == q.st.live_indexes() and back.release_cursor() == q.st.release_cursor()


def test_memory_per_queued_message_is_within_budget() -> None:
    st = QueueState()
    cmds = [make_enqueue(None, 0, 1000) for _ in range(100_000)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i, cmd in enumerate(cmds, 1):
        apply(Meta(i, 1, 0), cmd, st)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert st.ready_count() == 100_000
    assert used / 100_000 <= 64, used / 100_000


# -- enqueue batches -----------------------------------------------------------------------------------
def test_batch_ids_are_entry_and_position_and_fifo_holds_across_batches_and_single_enqueues() -> None:
    q = Q()
    (a,) = q.pub(1)
    b = q.batch([1, 2, 3])
    assert q.reply == 3 and q.effects == []  # untracked: no confirms
    (c,) = q.pub(1)
    d = q.batch([4, 5])
    assert (a, b, c, d) == (m(1), [m(2), m(2) + 1, m(2) + 2], m(3), [m(4), m(4) + 1])
    assert m(1) < m(2) + 2 < m(3) < m(4)  # ids grow with the log, positions included
    assert list(q.st.messages.records()) == [(a, 10, 0, 0), (b[0], 1, 0, 0), (b[1], 2, 0, 0), (b[2], 3, 0, 0),
                                             (c, 10, 0, 0), (d[0], 4, 0, 0), (d[1], 5, 0, 0)]
    assert q.st.ready_bytes == 35 and q.st.message_count() == 7
    assert [q.st.live.holds(i) for i in range(6)] == [0, 1, 3, 1, 2, 0]
    q.do(make_dequeue("g", True))
    assert q.reply == DequeueReply((a, a, False, 0), 6)
    q.do(make_checkout("c", 3))
    assert q.delivered() == b and q.of(Deliver)[0].messages[1] == (b[1], b[1], False, 0)
    q.do(make_return("c", [b[1]]))  # no delivery limit: to the back, keeping its id
    assert q.delivered() == [c]
    q.do(make_settle("c", [b[0], b[2]]))
    assert q.delivered() == d
    q.do(make_settle("c", [c]))
    assert q.of(Deliver) == [Deliver("c", ((b[1], b[1], True, 1),))]


def test_batch_of_batch_max_messages_fills_one_entry() -> None:
    q = Q()
    ids = q.batch([1] * BATCH_MAX)
    (after,) = q.pub(1)
    assert ids == list(range(m(1), m(1) + BATCH_MAX)) and ids[-1] < after == m(2)
    assert q.st.live.holds(1) == BATCH_MAX and q.st.live.holds(2) == 1
    q.do(make_checkout("c", 0))
    assert q.delivered() == ids + [after]
    q.do(make_settle("c", ids[:-1]))
    assert q.st.live.holds(1) == 1 and q.st.release_cursor() == 1
    q.do(make_settle("c", ids[-1:]))
    assert q.st.live.holds(1) == 0 and q.st.release_cursor() == 2


def test_batch_confirms_every_seq_in_one_confirm_effect() -> None:
    q = Q()
    assert q.batch([10] * 5, "p", first_seq=1) and q.effects == [Confirm("p", (1, 2, 3, 4, 5))]
    assert q.reply == 5 and q.st.publishers["p"].last_seq == 5
    q.do(make_enqueue("p", 6, 10))
    assert q.reply == OK
    q.do(make_enqueue("p", 3, 10))
    assert q.reply == DUPLICATE
    q.do(make_checkout("c", 2))
    q.batch([10, 10, 10], "p", first_seq=7)  # delivered in the same apply: the confirm still comes first
    assert q.effects == [Confirm("p", (7, 8, 9))]
    assert q.st.ready_count() == 7


def test_resend_of_a_whole_batch_after_part_of_it_was_applied() -> None:
    q = Q()
    # batch 1..6 went to a leader that applied seqs 1 and 2, and 5 arrived ahead of 3 and 4
    q.do(make_enqueue("p", 1, 10))
    q.do(make_enqueue("p", 2, 10))
    q.do(make_enqueue("p", 5, 10))
    assert q.st.publishers["p"].missing == [[3, 4]]
    ids = q.batch([1, 2, 3, 4, 5, 6], "p", first_seq=1)  # the whole batch resent after the leader change
    assert q.effects == [Confirm("p", (1, 2, 3, 4, 5, 6))]  # duplicates confirmed again, with the rest
    assert q.reply == 3  # 3, 4 (the gap) and 6 (new)
    assert q.st.ready_indexes() == [m(1), m(2), m(3), ids[2], ids[3], ids[5]]
    assert [r[1] for r in q.st.messages.records()] == [10, 10, 10, 3, 4, 6]
    assert q.st.publishers["p"].missing == [] and q.st.publishers["p"].last_seq == 6
    assert q.st.live.holds(4) == 3
    q.batch([1, 2, 3, 4, 5, 6], "p", first_seq=1)  # and again: every seq a duplicate
    assert q.effects == [Confirm("p", (1, 2, 3, 4, 5, 6))] and q.reply == 0
    assert q.st.ready_count() == 6 and q.st.live.holds(q.index) == 0
    q.batch([1, 2, 3], "p", first_seq=5)  # overlapping the end: 5 and 6 duplicates, 7 new
    assert q.effects == [Confirm("p", (5, 6, 7))] and q.reply == 1
    assert q.st.ready_indexes()[-1] == m(q.index, 2)


def test_batch_starting_past_the_last_seq_records_the_gap_and_a_later_batch_fills_it() -> None:
    q = Q()
    q.batch([1, 1], "p", first_seq=1)
    q.batch([1, 1], "p", first_seq=6)  # 3, 4, 5 not seen yet
    assert q.st.publishers["p"].missing == [[3, 5]]
    q.batch([1, 1, 1, 1, 1], "p", first_seq=3)  # 3..5 overtaken: new; 6, 7 duplicates
    assert q.effects == [Confirm("p", (3, 4, 5, 6, 7))] and q.reply == 3
    assert q.st.publishers["p"].missing == [] and q.st.ready_count() == 7
    assert q.st.ready_indexes()[-3:] == [m(3), m(3, 1), m(3, 2)]


def test_reject_publish_reached_in_the_middle_of_a_batch_rejects_exactly_the_rest() -> None:
    q = Q(max_length=3, overflow="reject-publish")
    q.do(make_enqueue("p", 1, 10))
    ids = q.batch([10] * 5, "p", first_seq=2)
    assert q.of(Confirm) == [Confirm("p", (2, 3))] and q.of(Reject) == [Reject("p", (4, 5, 6))]
    assert q.of(OverflowStatus) == [OverflowStatus(True)] and q.reply == 2
    assert q.st.ready_indexes() == [m(1), ids[0], ids[1]] and q.st.live.holds(2) == 2
    assert q.do(make_enqueue("p", 5, 10)) == [Reject("p", (5,))] and q.reply == REJECTED  # refused again
    q.do(make_checkout("c", 10))  # room again
    assert q.st.ready_count() == 0
    q.batch([10] * 5, "p", first_seq=2)  # a resend of the batch: still never both acked and nacked
    assert q.of(Confirm) == [Confirm("p", (2, 3))] and q.of(Reject) == [Reject("p", (4, 5, 6))]
    assert q.reply == 0 and q.delivered() == []
    q.batch([10, 10], "p", first_seq=7)
    assert q.of(Confirm) == [Confirm("p", (7, 8))] and q.reply == 2


def test_reject_publish_by_bytes_is_decided_per_message_of_a_batch() -> None:
    q = Q(max_length_bytes=25, overflow="reject-publish")
    ids = q.batch([10, 10, 10, 5, 1], "p", first_seq=1)
    assert q.of(Confirm) == [Confirm("p", (1, 2, 4))] and q.of(Reject) == [Reject("p", (3, 5))]
    assert q.st.ready_indexes() == [ids[0], ids[1], ids[3]] and q.st.ready_bytes == 25
    assert q.st.publishers["p"].rejected == [[3, 3], [5, 5]]


def test_untracked_batch_rejected_in_part_is_silent_and_counts_what_it_enqueued() -> None:
    q = Q(max_length=2, overflow="reject-publish")
    ids = q.batch([1, 1, 1, 1])
    assert q.reply == 2 and q.effects == [OverflowStatus(True)]
    assert q.st.ready_indexes() == ids[:2] and not q.st.publishers


def test_per_message_ttl_within_a_batch() -> None:
    q = Q(message_ttl_ms=1000)
    q.batch([1, 1, 1], ttls=[None, 10, 5000])  # the smaller of the queue's and the message's TTL
    assert [r[2] for r in q.st.messages.records()] == [q.now + 1000, q.now + 10, q.now + 1000]
    q = Q()
    q.batch([1, 1], ttls=None)
    assert not q.st.messages.may_expire
    ids = q.batch([1, 1, 1, 1], ttls=[10, None, 5, None])
    assert [r[2] for r in q.st.messages.records()] == [0, 0, q.now + 10, 0, q.now + 5, 0]
    q.do(make_dequeue("g", True))
    q.do(make_dequeue("g", True))
    q.now += 10
    q.do(make_tick(q.now))
    assert q.of(Dropped) == [Dropped("expired", (ids[0],))]  # the head only
    q.do(make_checkout("c", 10))
    assert q.delivered() == [ids[1], ids[3]] and q.of(Dropped) == [Dropped("expired", (ids[2],))]


def test_ttl_zero_messages_of_a_batch_go_to_a_consumer_with_credit_else_expire() -> None:
    q = Q(**DLX)
    ids = q.batch([1, 1, 1], ttls=[0, 0, 0])
    assert q.of(DeadLetter) == [DeadLetter("expired", tuple(ids))] and q.st.message_count() == 0
    q.do(make_checkout("c", 2))
    ids = q.batch([1, 1, 1, 1], ttls=[0, None, 0, 0])
    assert q.delivered() == ids[:2]
    assert q.of(DeadLetter) == [DeadLetter("expired", tuple(ids[2:]))]
    q = Q(message_ttl_ms=0)
    q.do(make_checkout("c", 3))
    ids = q.batch([1] * 5)
    assert q.delivered() == ids[:3] and q.of(Dropped) == [Dropped("expired", tuple(ids[3:]))]


def test_release_cursor_stays_at_a_batch_until_every_message_of_it_is_settled() -> None:
    q = Q(release_step=1)
    ids = q.batch([1, 1, 1])
    assert q.of(ReleaseCursor) == [ReleaseCursor(1)]
    (single,) = q.pub(1)
    q.do(make_checkout("c", 10))
    q.do(make_settle("c", [ids[0], ids[2]]))
    assert q.st.release_cursor() == 1 and q.of(ReleaseCursor) == [] and q.st.live.holds(1) == 1
    q.do(make_settle("c", [ids[1]]))
    assert q.st.release_cursor() == entry(single) == 2 and q.of(ReleaseCursor) == [ReleaseCursor(2)]
    q.do(make_settle("c", [single]))
    assert q.st.release_cursor() == q.index and q.of(ReleaseCursor) == [ReleaseCursor(q.index)]


def test_release_cursor_survives_a_long_gap_of_batches() -> None:
    q = Q()
    ids = q.batch([1, 1])
    q.do(make_checkout("c", 0))
    q.do(make_settle("c", ids[:1]))
    for _ in range(6_000):
        q.do(make_settle("c", q.batch([1, 1, 1])))
    assert q.st.release_cursor() == 1 and q.st.live.holds(1) == 1 and q.st.live.count == 1
    q.batch([1] * 4)
    assert q.st.live.holds(q.index) == 4 and q.st.release_cursor() == 1
    q.do(make_settle("c", ids[1:]))
    assert q.st.release_cursor() == q.index - 1 and q.st.live.count == 4
    assert q.st.live.nbytes() < 200  # the map was cut down


def test_a_requeue_of_a_batchs_last_live_message_releases_the_batchs_entry() -> None:
    q = Q()
    ids = q.batch([1, 1, 1])
    q.do(make_checkout("c", 10))
    q.do(make_settle("c", ids[:2]))
    assert q.st.release_cursor() == 1
    q.do(make_requeue("c", ids[2], b"\x02"))
    assert q.st.release_cursor() == q.index and q.st.live.holds(1) == 0 and q.st.live.holds(q.index) == 1
    assert q.delivered() == [m(q.index)]


def test_at_least_once_dead_letters_of_a_batch_hold_its_entry_until_settled() -> None:
    q = Q(**AT_LEAST_ONCE)
    ids = q.batch([1, 1, 1])
    q.do(make_checkout("c", 10))
    q.do(make_discard("c", ids))
    q.do(make_dlx_checkout(32))
    assert q.of(DlxDeliver) == [DlxDeliver(tuple((i, i, "rejected") for i in ids))]
    q.do(make_dlx_settle(ids[1:]))
    assert q.st.release_cursor() == 1 and q.st.message_count() == 1
    q.do(make_dlx_settle(ids[:1]))
    assert q.st.release_cursor() == q.index and q.st.message_count() == 0


def _live_counts(st: QueueState) -> dict[int, int]:
    entries = [entry(i) for i in st.live_indexes()]
    return {i: st.live.holds(i) for i in range(entries[0] - 1, entries[-1] + 2)} if entries else {}


def test_snapshot_with_batches_restores_an_equal_state_and_live_counts() -> None:
    q = Q(delivery_limit=3, message_ttl_ms=10_000, **AT_LEAST_ONCE)
    first = q.batch([1, 2, 3, 4], "p", ttls=[None, 50, None, 20_000])
    q.do(make_enqueue("p", 5, 1))
    single = m(q.index)
    second = q.batch([5, 6, 7], "p", first_seq=10)
    q.do(make_checkout("c", 3, priority=2))
    q.do(make_checkout(("x", 1), 2))
    q.do(make_settle("c", [first[0]]))
    q.do(make_return("c", [first[2]]))
    q.do(make_discard(("x", 1), [first[3]]))
    q.do(make_dlx_checkout(1))
    q.do(make_requeue("c", first[1], b"\x01"))
    q.do(make_purge())
    assert q.st.message_count() > 0 and q.st.live.holds(1) > 0 and second
    snap = q.st.snapshot()
    back = QueueState.restore(snap)
    assert back.snapshot() == snap
    assert back.live_indexes() == q.st.live_indexes() and back.release_cursor() == q.st.release_cursor()
    assert back.live.count == q.st.live.count and _live_counts(back) == _live_counts(q.st)
    assert back.publishers["p"].missing == [[6, 9]]
    # and both go on alike: a replica restored from the snapshot follows the same log
    replica = Q()
    replica.st, replica.index, replica.now = back, q.index, q.now
    for cmd in (make_settle("c", [single]),
                make_enqueue_batch("p", 6, [1, 1, 1], [0, None, 0], [0, 0, 0], b""),  # in the gap
                make_tick(q.now + 60), make_dlx_settle([first[3]]), make_checkout("c", 10)):
        assert replica.do(cmd) == q.do(cmd) and replica.reply == q.reply
        assert replica.st.snapshot() == q.st.snapshot() and _live_counts(replica.st) == _live_counts(q.st)


def test_quorum_machine_apply_command_equals_apply_of_the_encoded_entry() -> None:
    seen_a: list[Any] = []
    seen_b: list[Any] = []
    a = QuorumMachine(QuorumConfig(max_length=4, overflow="reject-publish"), effects_sink=seen_a.extend)
    b = QuorumMachine(QuorumConfig(max_length=4, overflow="reject-publish"), effects_sink=seen_b.extend)
    cmds = [make_enqueue_batch("p", 1, [1, 2, 3], [None, 5, None], [1, 1, 1], b"abc"), make_checkout("c", 2),
            make_enqueue_batch("p", 2, [1] * 5, None, [0] * 5, b""), make_enqueue("p", 7, 1),
            make_settle("c", [m(1), m(1, 1)]), make_enqueue_batch(None, 0, [9], None, [2], b"zz"),
            make_tick(99)]
    replies = []
    for i, cmd in enumerate(cmds, 1):
        replies.append(a.apply_command(i, 10 * i, cmd))
        assert replies[-1] == b.apply(i, encode(cmd, 10 * i))
        assert seen_a == seen_b
        assert a.snapshot() == b.snapshot()
    assert replies[0] == 3 and replies[2] == 3 and replies[3] == OK and replies[5] == 1
    assert seen_a[:2] == [Confirm("p", (1, 2, 3)),
                          Deliver("c", ((m(1), m(1), False, 0), (m(1, 2), m(1, 2), False, 0)))]
    assert Dropped("expired", (m(1, 1),)) in seen_a  # TTL 5 from time 10, checked out at 20
    assert a.state.ready_indexes() == [m(3, 3), m(3, 4), m(4), m(6)]


# -- a batch is applied as its messages' enqueues one by one would be ----------------------------------
def _setup(*cmds: Any) -> Callable[[Q], None]:
    def run(q: Q) -> None:
        for cmd in cmds:
            q.do(cmd)
    return run


def _outcome(config: dict[str, Any], setup: Callable[[Q], None], publisher: Any, first_seq: int,
             sizes: list[int], ttls: list[int | None] | None, as_batch: bool) -> dict[str, Any]:
    """What became of these publishes, as one batch or one enqueue each, the new messages named by their
    position (the messages of `setup` by their id)."""
    q = Q(**config)
    setup(q)
    base = q.index + 1
    effects: list[Any] = []
    if as_batch:
        q.batch(sizes, publisher, first_seq, ttls)
        effects += q.effects
        enqueued = q.reply
    else:
        enqueued = 0
        for p, size in enumerate(sizes):
            ttl = None if ttls is None else ttls[p]
            q.do(make_enqueue(publisher, first_seq + p if publisher else 0, size, ttl))
            effects += q.effects
            enqueued += q.reply == OK

    def name(msg_id: int) -> tuple[str, int]:
        if entry(msg_id) < base:
            return "old", msg_id
        return "new", msg_id - m(base) if as_batch else entry(msg_id) - base

    deliveries: dict[Any, list[Any]] = {}
    for e in effects:
        if isinstance(e, Deliver):
            deliveries.setdefault(e.consumer_key, []).extend((name(i), r, n) for i, _ref, r, n in e.messages)
    pub = q.st.publishers.get(publisher)
    return {
        "enqueued": enqueued,
        "confirmed": [s for e in effects if isinstance(e, Confirm) for s in e.seqs],
        "rejected": [s for e in effects if isinstance(e, Reject) for s in e.seqs],
        "deliveries": deliveries,
        "dead": sorted((type(e).__name__, e.reason, name(i)) for e in effects
                       if isinstance(e, DeadLetter | Dropped) for i in e.raft_indexes),
        "ready": [(name(i), size, exp, n)
                  for i, size, exp, n in list(q.st.returns) + list(q.st.messages.records())],
        "checked_out": {k: [name(i) for i in q.st.checked_out(k)] for k in q.st.consumers.by_key},
        "dlx": [name(i) for i in q.st.dlx.indexes()],
        "publisher": None if pub is None else (pub.last_seq, pub.missing, pub.rejected),
        "counts": (q.st.ready_bytes, q.st.live.count, q.st.rejecting, q.st.consumers.unacked),
    }


_EQUIVALENT = {
    "dedup-and-gap": ({}, _setup(make_enqueue("p", 1, 1), make_enqueue("p", 2, 1), make_enqueue("p", 5, 1)),
                      "p", 1, [1, 2, 3, 4, 5, 6], None),
    "reject-publish-length": ({"max_length": 3, "overflow": "reject-publish"},
                              _setup(make_enqueue("p", 1, 1)), "p", 2, [1] * 5, None),
    "reject-publish-bytes": ({"max_length_bytes": 25, "overflow": "reject-publish"}, _setup(),
                             "p", 1, [10, 10, 10, 5, 1], None),
    "rejected-resend": ({"max_length": 1, "overflow": "reject-publish"},
                        _setup(make_enqueue("p", 1, 1), make_enqueue("p", 2, 1), make_enqueue("p", 3, 1),
                               make_checkout("c", 10)), "p", 1, [1, 1, 1, 1], None),
    "untracked-rejected": ({"max_length": 2, "overflow": "reject-publish", **DLX}, _setup(),
                           None, 0, [1] * 4, None),
    "at-least-once-limit": ({"max_length": 3, **AT_LEAST_ONCE, "delivery_limit": 0},
                            _setup(make_enqueue("p", 1, 1), make_checkout("c", 1), make_return("c", [m(1)]),
                                   make_cancel("c")),
                            "p", 2, [1] * 4, None),
    "ttls-no-consumer": ({"message_ttl_ms": 1000}, _setup(), "p", 1, [1] * 6, [10, 0, None, 0, 5000, 0]),
    "ttls-expiring-heads": (DLX, _setup(), "p", 1, [1] * 5, [0, 0, None, 0, 7]),
    "ttl-zero-some-credit": (DLX, _setup(make_checkout("c", 2)), None, 0, [1] * 4, [0, 0, 0, 0]),
    "ttl-zero-expired-head-first": ({}, _setup(make_checkout("c", 1), make_enqueue(None, 0, 1, 0)),
                                    "p", 1, [1, 1], [0, None]),
    "drop-head-with-consumer": ({"max_length": 1, **DLX}, _setup(make_checkout("c", 1)),
                                "p", 1, [1] * 4, None),
    "drop-head-bytes": ({"max_length_bytes": 12}, _setup(make_enqueue(None, 0, 5)),
                        None, 0, [4, 4, 4, 4], None),
    "round-robin": ({}, _setup(make_checkout("a", 2), make_checkout("b", 2)), "p", 1, [1] * 5, None),
    "sac": ({"single_active_consumer": True}, _setup(make_checkout("a", 2), make_checkout("b", 9)),
            "p", 1, [1] * 3, None),
}


@pytest.mark.parametrize("case", list(_EQUIVALENT))
def test_a_batch_is_applied_as_one_enqueue_per_message_would_be(case: str) -> None:
    config, setup, publisher, first_seq, sizes, ttls = _EQUIVALENT[case]
    batch = _outcome(config, setup, publisher, first_seq, sizes, ttls, as_batch=True)
    singles = _outcome(config, setup, publisher, first_seq, sizes, ttls, as_batch=False)
    assert batch == singles


def test_reject_publish_with_a_consumer_taking_messages_accepts_a_batch_as_single_enqueues_would() -> None:
    config = {"max_length": 1, "overflow": "reject-publish"}
    setup = _setup(make_checkout("c", 10))
    singles = _outcome(config, setup, "p", 1, [1, 1, 1], None, as_batch=False)
    assert singles["confirmed"] == [1, 2, 3] and singles["rejected"] == []
    assert _outcome(config, setup, "p", 1, [1, 1, 1], None, as_batch=True) == singles
