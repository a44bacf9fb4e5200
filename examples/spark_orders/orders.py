"""The orders of the example: what an order looks like, how it is published, and the topology.

An incoming order in a sales system is the textbook message that must not be lost (RabbitMQ's quorum
queue guide uses exactly this example). Orders are JSON, published persistent with publisher confirms,
with `message_id` = the order id and the AMQP `timestamp` set, to the durable queue `orders`.

Topology (declared by `declare_topology`):
- queue `orders`: durable classic queue. Switch it to a quorum queue (argument x-queue-type=quorum)
  once hutch has quorum queues; nothing else in the example changes. hutch does not persist messages
  yet: durable flags are accepted, but messages do not survive a broker restart.
- exchange `orders.totals` (topic): the pipeline publishes one message per (window, region) here, with
  routing key = region; queue `orders.totals.audit` (durable) is bound with `#` so the results can be
  read back.
"""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pika

ORDERS_QUEUE = "orders"
TOTALS_EXCHANGE = "orders.totals"
TOTALS_AUDIT_QUEUE = "orders.totals.audit"
REGIONS = ("eu-west", "eu-north", "us-east", "us-west", "ap-south")
WINDOW_S = 10


def connect(uri: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.URLParameters(uri))


def declare_topology(uri: str) -> None:
    with connect(uri) as conn:
        ch = conn.channel()
        ch.queue_declare(ORDERS_QUEUE, durable=True)  # quorum: arguments={"x-queue-type": "quorum"}
        ch.exchange_declare(TOTALS_EXCHANGE, "topic", durable=True)
        ch.queue_declare(TOTALS_AUDIT_QUEUE, durable=True)
        ch.queue_bind(TOTALS_AUDIT_QUEUE, TOTALS_EXCHANGE, "#")


@dataclass
class Ledger:
    """What the publisher confirmed, per (window start in epoch seconds, region): the truth the
    pipeline's output is checked against."""

    orders: dict[tuple[int, str], int]
    cents: dict[tuple[int, str], int]
    published: int = 0

    @classmethod
    def empty(cls) -> Ledger:
        return cls(defaultdict(int), defaultdict(int))

    def add(self, order: dict[str, Any]) -> None:
        key = (order["created_ms"] // 1000 // WINDOW_S * WINDOW_S, order["region"])
        self.orders[key] += 1
        self.cents[key] += order["amount_cents"]
        self.published += 1


def make_order(n: int, rng: random.Random, created_ms: int | None = None) -> dict[str, Any]:
    return {
        "order_id": f"o-{n:09d}",
        "customer": f"c-{rng.randrange(100_000):06d}",
        "region": rng.choice(REGIONS),
        "amount_cents": rng.randrange(100, 50_000),
        "items": rng.randrange(1, 8),
        "created_ms": created_ms if created_ms is not None else int(time.time() * 1000),
    }


def publish_orders(uri: str, count: int, rate: float, ledger: Ledger | None = None, seed: int = 7,
                   first: int = 0, route: Callable[[dict[str, Any]], tuple[str, str]] | None = None) -> float:
    """Publish `count` orders at about `rate` per second (0: as fast as possible) with confirms; every
    order is in `ledger` once the broker confirmed it. `route(order)` gives (exchange, routing key)
    (default: the `orders` queue). Returns the seconds it took."""
    rng = random.Random(seed + first)
    start = time.monotonic()
    with connect(uri) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(first, first + count):
            if rate:
                ahead = (i - first) / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            order = make_order(i, rng)
            exchange, routing_key = route(order) if route else ("", ORDERS_QUEUE)
            ch.basic_publish(exchange, routing_key, json.dumps(order).encode(), pika.BasicProperties(
                content_type="application/json", delivery_mode=2, message_id=order["order_id"],
                timestamp=order["created_ms"] // 1000, app_id="shop"), mandatory=True)
            if ledger is not None:
                ledger.add(order)
    return time.monotonic() - start


def publish_watermark_tick(uri: str, seconds_ahead: int) -> None:
    """One order far enough in the future to move the pipeline's watermark past every real window, so
    that append mode emits them (a stream that keeps flowing does this by itself)."""
    order = make_order(999_999_999, random.Random(0), int((time.time() + seconds_ahead) * 1000))
    order["region"] = "tick"
    order["amount_cents"] = 0
    with connect(uri) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.basic_publish("", ORDERS_QUEUE, json.dumps(order).encode(), pika.BasicProperties(
            content_type="application/json", delivery_mode=2, message_id=order["order_id"]))
