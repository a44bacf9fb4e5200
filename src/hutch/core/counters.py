"""A channel's message counters as the management agent reports them and the statistics collector samples.

Owns: a channel's management name (`channel_name`), a queue's counters (`queue_values`,
`QUEUE_MSG_STATS`), `CHANNEL_FIELDS` (the order of a channel's counters in a values tuple), `MSG_STATS` (RabbitMQ's
message_stats names as sums of those positions), and the pure readings over a channel's `stat_*`
attributes (`channel_values`, `closed_values` for the node's folded totals of closed channels,
`exchange_counts` for its publishes per exchange), and a channel's Prometheus row (`CHANNEL_METRIC_FIELDS`,
`channel_metric_values`: what mgmt/prometheus.py's channel families read, sent by the management agent as
plain numbers so a node of workers sums every worker's). Pure: reads attributes, never changes them, and
knows no runtime class (a channel is anything with the `stat_*` and `x_*` attributes).

Rules:
- `deliver` is the manual-acknowledgement deliveries (`stat_deliver` less `stat_deliver_no_ack`),
  `deliver_get` the sum of the four delivery kinds, as RabbitMQ counts them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CHANNEL_FIELDS = ("publish", "confirm", "return_unroutable", "drop_unroutable", "deliver", "deliver_no_ack",
                  "get", "get_no_ack", "get_empty", "redeliver", "ack")
MSG_STATS = tuple((name, (i,)) for i, name in enumerate(CHANNEL_FIELDS)) + (("deliver_get", (4, 5, 6, 7)),)
ZERO_CHANNEL = (0,) * len(CHANNEL_FIELDS)
# a queue's: (ready, unacked, published, delivered, get, acked, redelivered), as `queue_values` reads them
QUEUE_MSG_STATS = (("publish", (2,)), ("deliver", (3,)), ("get", (4,)), ("deliver_get", (3, 4)), ("ack", (5,)),
                   ("redeliver", (6,)))


def channel_name(ch: Any) -> str:
    """A channel's name in the management API and metrics: "<connection name> (<number>)"."""
    return f"{ch.conn.name} ({ch.number})"


def channel_values(ch: Any) -> tuple[int, ...]:
    """A channel's counters in CHANNEL_FIELDS order (`deliver` is manual-acknowledgement deliveries)."""
    return (ch.stat_publish, ch.stat_confirm, ch.stat_return_unroutable, ch.stat_drop_unroutable,
            ch.stat_deliver - ch.stat_deliver_no_ack, ch.stat_deliver_no_ack, ch.stat_get, ch.stat_get_no_ack,
            ch.stat_get_empty, ch.stat_redeliver, ch.stat_ack)


def closed_values(closed: Mapping[str, int]) -> tuple[int, ...]:
    """`Node.closed_channel_stats` (attribute name -> total) in CHANNEL_FIELDS order."""
    g = closed.get
    deliver_no_ack = g("stat_deliver_no_ack", 0)
    return (g("stat_publish", 0), g("stat_confirm", 0), g("stat_return_unroutable", 0),
            g("stat_drop_unroutable", 0), g("stat_deliver", 0) - deliver_no_ack, deliver_no_ack,
            g("stat_get", 0), g("stat_get_no_ack", 0), g("stat_get_empty", 0), g("stat_redeliver", 0),
            g("stat_ack", 0))


CHANNEL_METRIC_FIELDS = (
    "consumers", "unacked", "unconfirmed", "uncommitted", "prefetch_count", "global_prefetch",
    "publish", "confirm", "redeliver", "ack",
    "deliver",
    "return_unroutable", "drop_unroutable", "get", "get_no_ack", "deliver_manual", "deliver_no_ack", "get_empty",
    "publish_confirm", "routed",
)
"""A channel's Prometheus row, in the order of mgmt/prometheus.py's channel families (CHANNEL,
CHANNEL_COUNTERS, HUTCH_CHANNEL, CHANNEL_MORE), then confirm-mode publishes and routed enqueues (which feed
the rabbitmq_global_* counters). `deliver` is every delivery, `deliver_manual` those with manual ack."""


def channel_metric_values(ch: Any) -> tuple[int, ...]:
    """A channel's row in CHANNEL_METRIC_FIELDS order."""
    uncommitted = sum(1 for op in ch.tx_ops if op[0] == "publish") if ch.tx else 0
    return (
        len(ch.consumers), len(ch.unacked), ch.unconfirmed_count(), uncommitted, ch.prefetch_count,
        ch.global_prefetch,
        ch.stat_publish, ch.stat_confirm, ch.stat_redeliver, ch.stat_ack,
        ch.stat_deliver,
        ch.stat_return_unroutable, ch.stat_drop_unroutable, ch.stat_get, ch.stat_get_no_ack,
        ch.stat_deliver - ch.stat_deliver_no_ack, ch.stat_deliver_no_ack, ch.stat_get_empty,
        ch.stat_publish_confirm, ch.stat_routed,
    )


def queue_values(q: Any) -> tuple[int, ...]:
    """A queue's lengths and counters in the order QUEUE_MSG_STATS names them by."""
    return (q.message_count, q.unacked_count, q.stat_published, q.stat_delivered, q.stat_get, q.stat_acked,
            q.stat_redelivered)


def queue_counters(stats: Mapping[str, int], ready: int, unacked: int) -> tuple[int, ...]:
    """The inverse of a queue's message_stats (QUEUE_MSG_STATS) and lengths: `queue_values`' order."""
    return (ready, unacked, *(int(stats.get(name, 0)) for name in ("publish", "deliver", "get", "ack", "redeliver")))


def add(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


def msg_stats(values: Sequence[int]) -> dict[str, int]:
    """Counters in CHANNEL_FIELDS order by RabbitMQ's message_stats names (MSG_STATS)."""
    assert len(values) == len(CHANNEL_FIELDS)
    return {name: sum(values[i] for i in idx) for name, idx in MSG_STATS}


def values_of(stats: Mapping[str, int]) -> tuple[int, ...]:
    """The inverse of `msg_stats`: a message_stats dict back in CHANNEL_FIELDS order."""
    return tuple(int(stats.get(name, 0)) for name in CHANNEL_FIELDS)


def exchange_counts(ch: Any) -> dict[Any, tuple[int, int]]:
    """The channel's (publishes, enqueues) per exchange object, the current exchange included."""
    out = {x: (c[0], c[1]) for x, c in ch.x_counts.items()}
    current = ch.x_current
    if current is not None:
        base_published, base_routed = ch.x_base
        p, r = out.get(current, (0, 0))
        out[current] = (p + ch.stat_publish - base_published, r + ch.stat_routed - base_routed)
    return out


__all__ = ["CHANNEL_FIELDS", "CHANNEL_METRIC_FIELDS", "MSG_STATS", "QUEUE_MSG_STATS", "ZERO_CHANNEL", "add",
           "channel_metric_values", "channel_name", "channel_values", "closed_values", "msg_stats",
           "queue_counters", "queue_values", "values_of"]
