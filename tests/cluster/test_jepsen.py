"""A Jepsen-style test of quorum queues (issue 7): publishers with confirms and consumers with manual
acks on every node of a real cluster while a seeded nemesis kills, pauses and partitions nodes; then
every confirmed message must have been consumed, nothing unpublished consumed, and the queue empty. The
same with a replicated stream (issue 23): every confirmed message on every member, once, in order, and
every member holding the same log.

The workload, nemesis and checker are in tests/cluster/jepsen.py; docs/quorum-queues.md ("Jepsen-style
test") says what is checked. `make test` runs one short seeded run on 3 nodes (seed 2; `make test-slow`
adds seed 5); `make jepsen` (and `make test-slow`) runs the long ones on 3 and 5 nodes, or on the node
counts HUTCH_JEPSEN_NODES names ("5", "3,5,7"): HUTCH_JEPSEN_SEEDS ("1-8", "3,7,11"; default 1-4) and
HUTCH_JEPSEN_SECONDS (per run, default 60). Every run prints one summary line, lost and phantom counts
included. The same workload on 3 nodes of 2 worker processes each (`workers="2"`): seeds 2 and 5 short,
and the long seeds, in the slow set.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pika
import pytest

from .jepsen import JepsenConfig, JepsenResult, excerpts, params, queue_info, run, start_cluster

# seed 2: crash (kill -9 of every node), majorities ring (a bridge on 3 nodes), kill -9, random halves;
# seed 5: one node isolated, pause, kill -9 twice (the leader half the time). 16 s each.
FAST_SEEDS = [2, pytest.param(5, marks=pytest.mark.slow)]  # `make test` runs seed 2; `make test-slow` 5 too
FAST_SECONDS = 16.0


def _numbers(variable: str, default: str) -> list[int]:
    """The integers an environment variable lists: "1-4", "3,7,11", "2,5-6"."""
    out: list[int] = []
    for part in os.environ.get(variable, default).replace(" ", "").split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += range(int(lo), int(hi) + 1)
        elif part:
            out.append(int(part))
    return out


def _seconds() -> float:
    return float(os.environ.get("HUTCH_JEPSEN_SECONDS", "60"))


def _counts(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info.get(k) for k in ("messages_ready", "messages_unacknowledged", "consumers")}


def check(tmp: Path, cfg: JepsenConfig) -> JepsenResult:
    result = run(tmp, cfg)
    print(result.summary())
    if not result.ok:
        near = sorted(set(result.lost_at.values()))[:5]
        shown = [e for e in result.events if e[1] in ("nemesis", "run", "setup")
                 or any(abs(e[0] - t) < 1.0 for t in near)]
        events = "\n".join(f"  {t:8.3f} {who:8} {what[:200]}" for t, who, what in shown[-120:])
        pytest.fail(f"{result.summary()}\n(wall clock at t=0: {result.wall_start:.3f})\n"
                    f"events (the nemesis; clients within 1 s of a lost message's publish):\n{events}\n"
                    f"node logs (warnings and errors):\n{excerpts(tmp)}", pytrace=False)
    return result


@pytest.mark.timeout(FAST_SECONDS + 150)
@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_jepsen_3_nodes(tmp_path: Path, seed: int) -> None:
    check(tmp_path, JepsenConfig(nodes=3, seconds=FAST_SECONDS, seed=seed))


@pytest.mark.slow
@pytest.mark.timeout(_seconds() + 300)
@pytest.mark.parametrize("seed", _numbers("HUTCH_JEPSEN_SEEDS", "1-4"))
@pytest.mark.parametrize("nodes", _numbers("HUTCH_JEPSEN_NODES", "3,5"))
def test_jepsen_long(tmp_path: Path, nodes: int, seed: int) -> None:
    check(tmp_path, JepsenConfig(nodes=nodes, seconds=_seconds(), seed=seed))


# nodes of worker processes (docs/scaling.md, "A node of workers in a multi-node cluster"): 3 nodes of 2
# workers each, every worker a member; a node's kill -9 and pause take its supervisor and its workers
WORKER_SEEDS = [pytest.param(2, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow)]


@pytest.mark.timeout(FAST_SECONDS + 200)
@pytest.mark.parametrize("seed", WORKER_SEEDS)
def test_jepsen_3_nodes_of_2_workers(tmp_path: Path, seed: int) -> None:
    check(tmp_path, JepsenConfig(nodes=3, seconds=FAST_SECONDS, seed=seed, workers="2"))


@pytest.mark.slow
@pytest.mark.timeout(_seconds() + 300)
@pytest.mark.parametrize("seed", _numbers("HUTCH_JEPSEN_SEEDS", "1-4"))
def test_jepsen_workers_long(tmp_path: Path, seed: int) -> None:
    check(tmp_path, JepsenConfig(nodes=3, seconds=_seconds(), seed=seed, workers="2"))


# the stream workload (docs/streams.md, "On the node"): `make test` runs seed 3; the slow set runs the seeds
# HUTCH_JEPSEN_SEEDS names (default 1-4) on the node counts of HUTCH_JEPSEN_NODES, for HUTCH_JEPSEN_SECONDS
STREAM_SEEDS = [3]
STREAM_SECONDS = 12.0


def stream_config(nodes: int, seconds: float, seed: int) -> JepsenConfig:
    return JepsenConfig(nodes=nodes, seconds=seconds, seed=seed, kind="stream", queue="jepsen-stream")


@pytest.mark.timeout(STREAM_SECONDS + 200)
@pytest.mark.parametrize("seed", STREAM_SEEDS)
def test_jepsen_stream_3_nodes(tmp_path: Path, seed: int) -> None:
    result = check(tmp_path, stream_config(3, STREAM_SECONDS, seed))
    assert len(result.stream_lengths) == 3 and min(result.stream_lengths.values()) >= result.confirmed


@pytest.mark.slow
@pytest.mark.timeout(_seconds() + 300)
@pytest.mark.parametrize("seed", _numbers("HUTCH_JEPSEN_SEEDS", "1-4"))
@pytest.mark.parametrize("nodes", _numbers("HUTCH_JEPSEN_NODES", "3,5"))
def test_jepsen_stream_long(tmp_path: Path, nodes: int, seed: int) -> None:
    check(tmp_path, stream_config(nodes, _seconds(), seed))


def test_crash_of_every_node_leaves_no_consumer_holding_messages(tmp_path: Path) -> None:
    """Minimised from the jepsen run (3 nodes, seed 2, 30 s: "crash (kill -9 all)" first): a consumer's
    unacked messages must come back after the whole cluster crashed and restarted. Nobody proposed `down`
    for its node (no leader saw it go), so the consumer (node, id) stays in the queue's state holding them;
    and a consumer made on that node after the restart gets the same key (ids restart at 1) and inherits
    them: its credit is prefetch minus what the dead one held."""
    cluster = start_cluster(tmp_path, 3)
    try:
        n1, n2, n3 = cluster.nodes
        conn = pika.BlockingConnection(params(n1, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("crash-qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(100):
            ch.basic_publish("", "crash-qq", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()
        held = pika.BlockingConnection(params(n2, heartbeat=0))
        hch = held.channel()
        hch.basic_qos(prefetch_count=10)
        got: list[bytes] = []
        hch.basic_consume("crash-qq", lambda _c, _m, _p, body: got.append(body))  # never acks
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            held.process_data_events(0.1)
        assert len(got) == 10
        for node in cluster.nodes:
            node.kill()
        for node in cluster.nodes:
            node.start(wait=False)
        for node in cluster.nodes:
            node.wait_ready()
        cluster.wait_running({"n1", "n2", "n3"})
        bodies: set[bytes] = set()
        conns = []
        for node in (n2, n3):  # n2: the dead consumer's node, whose first consumer gets the same key
            c = pika.BlockingConnection(params(node, heartbeat=0))
            cch = c.channel()
            cch.basic_qos(prefetch_count=10)
            cch.basic_consume("crash-qq", lambda ch_, m, _p, body: (bodies.add(body),
                                                                     ch_.basic_ack(m.delivery_tag)))
            conns.append(c)
        deadline = time.monotonic() + 20
        while len(bodies) < 100 and time.monotonic() < deadline:
            for c in conns:
                c.process_data_events(0.05)
        info = queue_info(n1, "crash-qq") or {}
        assert len(bodies) == 100, f"consumed {len(bodies)} of 100 after the crash; queue: {_counts(info)}"
    finally:
        cluster.stop()


def test_a_delivery_in_flight_when_its_consumer_goes_is_returned(tmp_path: Path) -> None:
    """Minimised from the jepsen run (5 nodes, seed 1, 40 s; consumers take breaks): a consumer acks
    and closes its connection at once; the leader applies the settle, delivers the next message to it,
    then applies the cancel. The delivery reaches the consumer's node after the consumer was removed
    there and is dropped (`QuorumService._deliver_here`), while the machine keeps the message checked
    out to the cancelled consumer (a cancel does not return unacked messages): it is never delivered
    again. Each round here strands one message."""
    cluster = start_cluster(tmp_path, 3)
    try:
        n1, n2, _n3 = cluster.nodes
        conn = pika.BlockingConnection(params(n1, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("inflight-qq", durable=True, arguments={"x-queue-type": "quorum"})
        ch.confirm_delivery()
        for i in range(30):
            ch.basic_publish("", "inflight-qq", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()
        for node in [n2] * 5 + [n1] * 5:  # through a follower, and through the leader's own node
            c = pika.BlockingConnection(params(node, heartbeat=0))
            cch = c.channel()
            cch.basic_qos(prefetch_count=1)
            box: list[tuple[Any, bytes]] = []
            cch.basic_consume("inflight-qq", lambda _c, m, _p, body, box=box: box.append((m, body)))
            deadline = time.monotonic() + 10
            while not box and time.monotonic() < deadline:
                c.process_data_events(0.05)
            assert box, "no delivery"
            cch.basic_ack(box[0][0].delivery_tag)
            c.close()  # the ack and the close leave together
        info: dict[str, Any] = {}

        def settled() -> bool:
            nonlocal info
            info = queue_info(n1, "inflight-qq") or {}
            return info.get("messages_ready") == 20 and info.get("messages_unacknowledged") == 0

        deadline = time.monotonic() + 10
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert settled(), f"10 of 30 consumed; the queue: {_counts(info)}"
    finally:
        cluster.stop()


def test_settlements_in_flight_to_a_leader_that_dies_are_applied(tmp_path: Path) -> None:
    """The Jepsen runs on nodes of workers (docs/scaling.md, seed 2 at 16 s): settlements a consumer's
    node had sent on towards the leader, which died before committing them, left their messages checked
    out to a live consumer that had acked them, forever (no `down` for a node that is up). A command
    that leaves its node is now kept until the leader reports it applied and resent when the route
    changes (queues/quorum/client.py). 4 nodes, a queue of 3 members: consumers on a follower member
    and on the non-member ack everything while the leader is paused (their settles reach its socket and
    no further), then the leader is killed: the new leader applies the settles, nothing stays unacked,
    and what a new leader hands out again (every message it sees checked out) does not reach a
    consumer that acked it."""
    cluster = start_cluster(tmp_path, 4)
    try:
        n1 = cluster.nodes[0]
        conn = pika.BlockingConnection(params(n1, heartbeat=0))
        ch = conn.channel()
        ch.queue_declare("settle-qq", durable=True, arguments={"x-queue-type": "quorum",
                                                               "x-quorum-initial-group-size": 3})
        ch.confirm_delivery()
        for i in range(40):
            ch.basic_publish("", "settle-qq", f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()
        info: dict[str, Any] = {}

        def led() -> bool:
            nonlocal info
            info = queue_info(n1, "settle-qq") or {}
            return bool(info.get("leader"))

        deadline = time.monotonic() + 20
        while not led() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert led(), info
        members = set(info["members"])
        leader = next(n for n in cluster.nodes if n.full_name == info["leader"])  # n1, unless load made it another
        follower = next(n for n in cluster.nodes if n.full_name in members and n is not leader)
        outsider = next(n for n in cluster.nodes if n.full_name not in members)
        consumers = []
        for node in (follower, outsider):
            c = pika.BlockingConnection(params(node, heartbeat=0))
            cch = c.channel()
            cch.basic_qos(prefetch_count=20)
            box: list[tuple[Any, bytes]] = []
            cch.basic_consume("settle-qq", lambda _c, m, _p, body, box=box: box.append((m, body)))
            consumers.append((c, cch, box))
        deadline = time.monotonic() + 20
        while sum(len(box) for _c, _ch, box in consumers) < 40 and time.monotonic() < deadline:
            for c, _ch, _box in consumers:
                c.process_data_events(0.05)
        assert [len(box) for _c, _ch, box in consumers] == [20, 20]
        leader.pause()
        for _c, cch, box in consumers:
            cch.basic_ack(box[-1][0].delivery_tag, multiple=True)
            cch.basic_qos(prefetch_count=20)  # a round trip: the consumer's node has handled the ack
        leader.kill()
        left: dict[str, Any] = {}

        def settled() -> bool:
            nonlocal left
            for c, _ch, _box in consumers:
                c.process_data_events(0)
            left = queue_info(follower, "settle-qq") or {}
            return left.get("messages_unacknowledged") == 0 and left.get("messages_ready") == 0 \
                and left.get("leader") not in (None, leader.full_name)

        deadline = time.monotonic() + 40
        while not settled() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert settled(), f"the settles sent to the dead leader were not applied: {_counts(left)}"
        assert [len(box) for _c, _ch, box in consumers] == [20, 20], "an acked message was delivered again"
        for c, _ch, _box in consumers:
            c.close()
    finally:
        cluster.stop()
