"""The queue-type interface every queue implementation (classic now, quorum and stream later) offers.

Owns: `Consumer` (a subscription as the queue sees it), `QueueEntry` (a message as a queue holds it),
`Deliverer` (what a queue calls to hand a message to a consumer: the channel implements it) and
`Queue`, the abstract base the channel programs against. The channel never asks which type a queue
is; the queue never touches a socket.

Rules:
- A queue delivers by calling `consumer.channel.deliver(consumer, queue, entry)` synchronously; the
  channel records the delivery (unless no-ack) and encodes frames into its connection's write buffer.
- A consumer can take a message when its own prefetch and its channel's global prefetch allow it.
  When capacity frees up the channel calls `queue.deliver_pending()`.
- Settlement (`ack`, `requeue`, `discard`) always names the entries the queue handed out.
- Publishing answers one `Published`: SETTLED (the message is as safe as this queue type makes it, or
  nobody asked: no receipt), REJECTED (the queue refused it, e.g. reject-publish overflow, or lost it on
  the way; a confirming publisher gets a nack) or PENDING (only with a receipt: the queue keeps the
  `Receipt` and settles or rejects it later, never from inside `publish`: core/confirms.py). Each type
  says when a message is safe: classic after the group commit's fsync for a persistent message in a
  durable queue (at once otherwise), remote on the home node's answer, quorum on the committed
  Confirm/Reject effects. A queue deleted while it holds receipts tells their owners (`queue_deleted`).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .queue_settings import QueueSettings, settings_from_arguments

if TYPE_CHECKING:
    from .confirms import Receipt, ReceiptRun
    from .message import Message


class Published(enum.Enum):
    """What `Queue.publish` answers (see the module rules)."""

    SETTLED = "settled"
    PENDING = "pending"
    REJECTED = "rejected"


SETTLED = Published.SETTLED
PENDING = Published.PENDING
REJECTED = Published.REJECTED


class SocketState(Protocol):
    """What a queue may read of a consumer's connection: whether its socket is paused."""

    @property
    def write_paused(self) -> bool: ...


class Deliverer(Protocol):
    @property
    def conn(self) -> SocketState: ...

    def deliver(self, consumer: Consumer, queue: Queue, entry: QueueEntry) -> None: ...

    def can_take(self) -> bool: ...

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None: ...


class QueueEntry:
    """A message in a queue. `seq` orders entries; requeued entries go back to their seq position."""

    # on_disk: the entry is in its queue's index (persistent message of a durable queue, or paged out),
    # so settling it writes an ACK there
    # returns: failed deliveries (requeued by reject/nack or a lost consumer): x-delivery-count, delivery-limit
    __slots__ = ("seq", "msg", "redelivered", "delivery_count", "enqueued_at_ms", "expires_at_ms", "on_disk",
                 "returns")

    def __init__(self, seq: int, msg: Message, enqueued_at_ms: int = 0) -> None:
        self.seq = seq
        self.msg = msg
        self.redelivered = False
        self.delivery_count = 0
        self.enqueued_at_ms = enqueued_at_ms
        self.expires_at_ms = 0
        self.on_disk = False
        self.returns = 0

    def __repr__(self) -> str:
        return f"<QueueEntry {self.seq} {self.msg!r}{' redelivered' if self.redelivered else ''}>"


class Consumer:
    """A subscription. Invariant: `unacked` counts this consumer's deliveries not yet settled.

    `pace_*` and `keeping_up` are the consumer's pace for the flow rule (core/credit_flow.py): the time
    it last filled its prefetch (-1: not timing) and the counters then, and the last judgement."""

    __slots__ = ("tag", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked", "priority",
                 "arguments", "delivered", "frame_prefix",
                 "pace_start_ms", "pace_delivered", "pace_published", "pace_queue_settled", "keeping_up")

    def __init__(self, tag: str, channel: Deliverer, queue: Queue, no_ack: bool, exclusive: bool,
                 prefetch: int, priority: int = 0, arguments: dict[str, Any] | None = None) -> None:
        self.tag = tag
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.priority = priority
        self.arguments = arguments or {}
        self.delivered = 0
        # the encoded start of this consumer's basic.deliver payload (class, method, consumer tag)
        self.frame_prefix = b"\x00\x3c\x00\x3c" + bytes((len(tag.encode()),)) + tag.encode()
        self.pace_start_ms = -1
        self.pace_delivered = self.pace_published = self.pace_queue_settled = 0
        self.keeping_up = False

    def can_take(self) -> bool:
        if self.no_ack:
            return self.channel.can_take()
        return (not self.prefetch or self.unacked < self.prefetch) and self.channel.can_take()

    def __repr__(self) -> str:
        return f"<Consumer {self.tag} on {self.queue.name}>"


class Queue:
    """Abstract base of queue types. Subclasses implement the message and consumer operations."""

    queue_type: str = "abstract"
    remote: bool = False  # a stand-in for a queue whose home is another node (runtime/queue_types/remote_queue.py)

    def __init__(self, vhost: str, name: str, durable: bool, exclusive_owner: object | None,
                 auto_delete: bool, arguments: dict[str, Any]) -> None:
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = arguments
        self.deleted = False
        self.had_consumers = False
        # what x-arguments and policies add up to; replaced by apply_settings when a policy changes
        self.settings: QueueSettings = settings_from_arguments(arguments)
        # publishing connections paused by flow control until this queue drains (see deliver_pending)
        self.flow_waiters: set[Any] = set()
        # statistics, read by management
        self.stat_published = 0
        self.stat_delivered = 0
        self.stat_acked = 0
        self.stat_redelivered = 0
        self.stat_get = 0

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    def apply_settings(self, settings: QueueSettings) -> None:
        """New effective settings (a policy was set, changed or cleared): they take effect at once."""
        self.settings = settings

    # -- messages ------------------------------------------------------------------------------
    def publish(self, msg: Message, receipt: Receipt | None = None) -> Published:
        """Enqueue `msg`; with a `receipt`, the publisher waits to learn when it is safe (module rules)."""
        raise NotImplementedError

    # A queue type that takes `publish_raw` without building a `Message` first says so (the channel's
    # publish lane, runtime/session/channel.py, is used only for such a queue).
    accepts_raw = False

    def publish_raw(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes, route_tail: bytes,
                    header: bytes, receipt: Receipt | None = None) -> Published:
        """`publish` of a message given as it arrived: its property list (`props_raw`, made only of
        fixed-size properties, valid by its length), its body, the exchange and routing-key short strings
        (`route_tail`) and its content-header payload (class 60, weight 0, `len(body)`, `props_raw`).
        This default builds the `Message`; a queue type with `accepts_raw` stores the parts directly."""
        from .message import Message

        return self.publish(Message(exchange, routing_key, None, body, props_raw, route_tail, header), receipt)

    def publish_raw_run(self, exchange: str, routing_key: str, route_tail: bytes, contents: list[tuple[bytes, bytes]],
                        receipts: ReceiptRun | None = None) -> list[Published]:
        """`publish_raw` of each (content-header payload, body) of a run of publishes to one exchange and
        routing key, the receipts of the run's publishes in `receipts`; what each answered, in order.
        This default publishes them one by one; a queue type with `accepts_raw` may take the run whole
        (and keep `receipts` as one, if it answers PENDING for every publish)."""
        own = receipts.receipts() if receipts is not None else [None] * len(contents)
        return [self.publish_raw(exchange, routing_key, header[12:], body, route_tail, header, receipt)
                for (header, body), receipt in zip(contents, own, strict=True)]

    def get(self, channel: Deliverer | None, no_ack: bool) -> QueueEntry | None:
        """The head message for basic.get on `channel` (None: the management API's get)."""
        raise NotImplementedError

    def ack(self, entries: Iterable[QueueEntry]) -> None:
        raise NotImplementedError

    def requeue(self, entries: Iterable[QueueEntry]) -> None:
        raise NotImplementedError

    def discard(self, entries: Iterable[QueueEntry], reason: str = "rejected") -> None:
        raise NotImplementedError

    def purge(self) -> int:
        raise NotImplementedError

    def deliver_pending(self) -> None:
        raise NotImplementedError

    def needs_flow_control(self) -> bool:
        """True when publishers to this queue should be held back (see the classic queue)."""
        return False

    def flow_still_needed(self) -> bool:
        """Asked now and then while publishers are held back by this queue (the connection's recheck):
        False lets them go. The default keeps them: a queue type that overrides `needs_flow_control`
        says here when its rule no longer holds (classic and quorum queues do)."""
        return True

    def release_flow_if_done(self) -> None:
        """Let held publishers go when this queue's rule no longer holds (`flow_still_needed`)."""
        if self.flow_waiters and not self.flow_still_needed():
            self.release_flow()

    def release_flow(self) -> None:
        """Let every publishing connection held back by this queue read again."""
        if self.flow_waiters:
            waiters = list(self.flow_waiters)
            self.flow_waiters.clear()
            for conn in waiters:
                conn.flow_unblock(self)

    # -- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def remove_consumer(self, consumer: Consumer) -> None:
        raise NotImplementedError

    def consumers(self) -> list[Consumer]:
        raise NotImplementedError

    async def refresh_counts(self) -> None:
        """Before a check made outside a channel on the queue's counts (the management API's delete with
        if-empty / if-unused): a stand-in for a queue elsewhere asks its home for them now; a queue of this
        process has them already."""

    async def fetch_for_get(self, no_ack: bool) -> None:
        """Before a `get` made outside a channel (the management API's get): a queue whose messages live
        elsewhere (a stand-in for another worker's or node's queue) fetches the next one, which `get` then
        returns; a queue of this process has nothing to do."""

    def refuses_consumer(self, exclusive: bool) -> bool:
        """Whether a new consumer (`exclusive` or not) is refused as "in exclusive use": the queue has
        consumers and either the new one or one of them is exclusive (RabbitMQ's rule)."""
        existing = self.consumers()
        return bool(existing) and (exclusive or any(c.exclusive for c in existing))

    def consumer_info(self, consumer: Consumer) -> dict[str, Any]:
        """What management adds to `consumer`'s fields for this queue type (a stream: where it reads)."""
        return {}

    # -- counts --------------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        """Messages ready for delivery."""
        raise NotImplementedError

    @property
    def unacked_count(self) -> int:
        raise NotImplementedError

    @property
    def consumer_count(self) -> int:
        return len(self.consumers())

    @property
    def message_bytes(self) -> int:
        return 0

    @property
    def messages_ram(self) -> int:
        """Ready messages whose bodies are in RAM (the rest are paged out to disk)."""
        return self.message_count

    @property
    def messages_paged_out(self) -> int:
        return 0

    def delete(self) -> int:
        """Mark deleted, drop messages; returns the number of ready messages dropped."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vhost": self.vhost,
            "durable": self.durable,
            "auto_delete": self.auto_delete,
            "exclusive": self.exclusive,
            "arguments": self.arguments,
            "type": self.queue_type,
            "messages": self.message_count + self.unacked_count,
            "messages_ready": self.message_count,
            "messages_unacknowledged": self.unacked_count,
            "consumers": self.consumer_count,
            "message_bytes": self.message_bytes,
            "messages_ram": self.messages_ram,
            "messages_paged_out": self.messages_paged_out,
        }
