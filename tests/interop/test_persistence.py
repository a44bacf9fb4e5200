"""Persistent messages in durable classic queues survive a restart (graceful and kill -9).

Transient messages and non-durable queues do not; acked messages do not come back; a confirmed message
survives kill -9 (confirms mean fdatasync'd). Plus a unit test of the confirm prefix rule.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server
from hutch.core.confirms import ConfirmLedger

from . import helpers

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)


def connect(server: ServerInfo) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port, heartbeat=0))


def drain(server: ServerInfo, queue: str, ack: bool = True) -> list[tuple[bytes, bool]]:
    """Every message in `queue` as (body, redelivered), acked (or left unacked and requeued)."""
    conn = connect(server)
    ch = conn.channel()
    out = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            break
        out.append((body, method.redelivered))
        if ack:
            ch.basic_ack(method.delivery_tag)
    conn.close()
    if ack:
        storage_barrier(server)
    return out


def storage_barrier(server: ServerInfo) -> None:
    helpers.storage_barrier(server.amqp_port)


def restart(server: ServerInfo, tmp_path: Path, sig: int) -> ServerInfo:
    server.stop(sig)
    return start_server(tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill9"])
def test_persistent_messages_survive_restart(tmp_path: Path, sig: int) -> None:
    server = start_server(tmp_path)
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("durable", durable=True)
        ch.queue_declare("transient-q", durable=False)
        for i in range(20):
            ch.basic_publish("", "durable", f"p{i}".encode(), PERSISTENT)
            ch.basic_publish("", "durable", f"t{i}".encode(), TRANSIENT)
            ch.basic_publish("", "transient-q", f"x{i}".encode(), PERSISTENT)
        # ack the first five persistent and the first five transient ones
        acked = []
        for _ in range(10):
            method, _p, body = ch.basic_get("durable")
            acked.append(body)
            ch.basic_ack(method.delivery_tag)
        assert acked == [b for i in range(5) for b in (f"p{i}".encode(), f"t{i}".encode())]
        # deliver (but do not ack) two more: they come back too
        for _ in range(2):
            assert ch.basic_get("durable")[0] is not None
        conn.close()
        storage_barrier(server)
        server = restart(server, tmp_path, sig)
        got = drain(server, "durable")
        assert [b for b, _r in got] == [f"p{i}".encode() for i in range(5, 20)]
        # the one delivered before the restart comes back marked redelivered, the others do not
        assert [r for _b, r in got] == [True] + [False] * 14
        conn = connect(server)
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            ch.queue_declare("transient-q", passive=True)
        conn.close()
        # acked after the restart: gone after the next one as well
        server = restart(server, tmp_path, sig)
        assert drain(server, "durable") == []
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["graceful", "kill9"])
def test_small_and_large_messages_interleave_across_restart(tmp_path: Path, sig: int) -> None:
    """Embedded (small) and message-store (large) messages keep their order and flags across a restart."""
    server = start_server(tmp_path)

    def body(i: int) -> bytes:
        return f"m{i}:".encode() + (b"L" * 6000 if i % 2 else b"s")

    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("mixed", durable=True)
        for i in range(12):
            ch.basic_publish("", "mixed", body(i), PERSISTENT)
        tags = [ch.basic_get("mixed")[0].delivery_tag for _ in range(4)]  # 0..3 delivered
        ch.basic_ack(tags[0])
        ch.basic_ack(tags[1])  # 0 and 1 acked; 2 and 3 delivered, not acked
        conn.close()
        storage_barrier(server)
        server = restart(server, tmp_path, sig)
        got = drain(server, "mixed")
        assert [b for b, _r in got] == [body(i) for i in range(2, 12)]
        assert [r for _b, r in got] == [True, True] + [False] * 8
        server = restart(server, tmp_path, sig)
        assert drain(server, "mixed") == []
        stores = list((tmp_path / "data" / "msg_stores").rglob("*.rdq"))
        assert sum(f.stat().st_size for f in stores) < 6000  # the acked large messages were collected
    finally:
        server.stop()


def test_confirmed_messages_survive_kill9_and_large_messages(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    big = bytes(random.Random(1).getrandbits(8) for _ in range(1 << 10)) * 1024  # 1 MiB
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("confirmed", durable=True)
        n = 300
        for i in range(n):
            ch.basic_publish("", "confirmed", str(i).encode(), PERSISTENT)
        for i in range(3):
            ch.basic_publish("", "confirmed", big + bytes([i]), PERSISTENT)
        server.stop(signal.SIGKILL)  # right after the last confirm
        server = start_server(tmp_path)
        got = [b for b, _r in drain(server, "confirmed")]
        assert got[:n] == [str(i).encode() for i in range(n)]
        assert got[n:] == [big + bytes([i]) for i in range(3)]
    finally:
        server.stop()


def test_queue_delete_and_purge_are_persistent(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        for name in ("purged", "deleted"):
            ch.queue_declare(name, durable=True)
            for i in range(5):
                ch.basic_publish("", name, str(i).encode(), PERSISTENT)
        ch.queue_purge("purged")
        ch.basic_publish("", "purged", b"after", PERSISTENT)
        ch.queue_delete("deleted")
        ch.queue_declare("deleted", durable=True)
        ch.basic_publish("", "deleted", b"new", PERSISTENT)
        conn.close()
        server = restart(server, tmp_path, signal.SIGKILL)
        assert [b for b, _r in drain(server, "purged")] == [b"after"]
        assert [b for b, _r in drain(server, "deleted")] == [b"new"]
    finally:
        server.stop()


def _publisher(server: ServerInfo, start: int, confirmed: list[int], stop: threading.Event) -> None:
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        i = start
        while not stop.is_set():
            ch.basic_publish("", "crash", str(i).encode(), PERSISTENT)
            confirmed.append(i)
            i += 1
    except Exception:  # the node was killed
        pass


def _consumer(server: ServerInfo, acked: list[int], stop: threading.Event) -> None:
    try:
        conn = connect(server)
        ch = conn.channel()
        # acks the even ids and leaves the odd ones delivered but unacked: those must come back
        for method, _props, body in ch.consume("crash", inactivity_timeout=0.05):
            if stop.is_set():
                break
            if method is None or int(body) % 2:
                continue
            ch.basic_ack(method.delivery_tag)
            acked.append(int(body))
    except Exception:  # the node was killed
        pass


def _crash_loop(tmp_path: Path, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    server = start_server(tmp_path)
    next_id = 0
    try:
        conn = connect(server)
        conn.channel().queue_declare("crash", durable=True)
        conn.close()
        for _ in range(rounds):
            confirmed: list[int] = []
            acked: list[int] = []
            stop = threading.Event()
            threads = [threading.Thread(target=_publisher, args=(server, next_id, confirmed, stop)),
                       threading.Thread(target=_consumer, args=(server, acked, stop))]
            for t in threads:
                t.start()
            time.sleep(rng.uniform(0.3, 1.0))
            server.stop(signal.SIGKILL)
            stop.set()
            for t in threads:
                t.join(10)
            server = start_server(tmp_path)
            present = [int(b) for b, _r in drain(server, "crash")]
            assert len(present) == len(set(present)), "a message appears twice"
            expected = set(confirmed) - set(acked)
            assert expected <= set(present), sorted(expected - set(present))[:10]
            assert all(next_id <= i < next_id + len(confirmed) + 1 for i in present)
            assert present == sorted(present)
            assert confirmed, "the publisher got no confirm before the kill"
            assert len(expected) > 10
            next_id += len(confirmed) + 1
    finally:
        server.stop()


def test_crash_loop_keeps_confirmed_unacked_messages(tmp_path: Path) -> None:
    """Bounded and seeded in `make test`; `make test-crash` runs a long one."""
    _crash_loop(tmp_path, rounds=4, seed=4)


@pytest.mark.slow
def test_crash_loop_long(tmp_path: Path) -> None:
    rounds = int(os.environ.get("HUTCH_CRASH_ROUNDS", "40"))
    seed = int(os.environ.get("HUTCH_CRASH_SEED", "7"))
    _crash_loop(tmp_path, rounds=rounds, seed=seed)


# -- unit tests ------------------------------------------------------------------------------------
def test_confirm_prefix_rule() -> None:
    """Publishes 1, 3, 5 wait for journal syncs 5, 7, 9; 2 and 4 are transient. Confirms follow
    publish order (the channel's ledger, core/confirms.py; the queue settles at each sync)."""
    ledger = ConfirmLedger()
    needs = {1: 5, 2: 0, 3: 7, 4: 0, 5: 9}
    for seq, need in needs.items():
        ledger.insert(seq, ["disk"] if need else ())

    def synced(upto: int) -> int:
        for seq, need in needs.items():
            if need and need <= upto:
                ledger.settle(seq, "disk")
        answers = ledger.take_answers()
        assert all(ack for ack, _tag, _multiple in answers)
        return answers[-1][1] if answers else ledger.answered

    assert synced(4) == 0  # the first waits for journal seq 5
    assert synced(5) == 2  # 1 synced; 2 is transient but behind 1
    assert synced(8) == 4
    assert ledger.waiting == 1
    assert synced(9) == 5
    assert not ledger.waiting


def test_a_durable_priority_queue_comes_back_in_priority_order(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("prio", durable=True, arguments={"x-max-priority": 3})
        for body, prio in [(b"l1", 0), (b"h1", 3), (b"m1", 1), (b"h2", 3), (b"l2", 0)]:
            ch.basic_publish("", "prio", body, pika.BasicProperties(delivery_mode=2, priority=prio))
        conn.close()
        server = restart(server, tmp_path, signal.SIGKILL)
        assert [b for b, _r in drain(server, "prio")] == [b"h1", b"h2", b"m1", b"l1", b"l2"]
    finally:
        server.stop()


def test_failed_delivery_counts_survive_a_restart(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    try:
        conn = connect(server)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("poison", durable=True, arguments={"x-delivery-limit": 3})
        ch.basic_publish("", "poison", b"p", PERSISTENT)
        for _ in range(2):
            method, _props, _body = ch.basic_get("poison")
            ch.basic_nack(method.delivery_tag, requeue=True)
        conn.close()
        storage_barrier(server)
        server = restart(server, tmp_path, signal.SIGKILL)
        conn = connect(server)
        ch = conn.channel()
        method, props, _body = ch.basic_get("poison")
        assert props.headers["x-delivery-count"] == 2
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, props, _body = ch.basic_get("poison")
        assert props.headers["x-delivery-count"] == 3
        ch.basic_nack(method.delivery_tag, requeue=True)  # the fourth failure: past the limit
        assert ch.basic_get("poison")[0] is None
        conn.close()
    finally:
        server.stop()
