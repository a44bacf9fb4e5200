"""A node of 2 worker processes (`hutch-server --workers 2`) against pika: every path across the worker
hop, and the supervisor's work (a worker killed, hung, the parent killed, a restart).

Connections are pinned to a worker through `workers.own_ports` (each worker's own AMQP port, `amqp_w0`
and `amqp_w1` in the ports file); everything else uses the node's one shared AMQP port. Waits poll with
generous deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from base64 import b64encode
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest
from pika.exceptions import AMQPConnectionError, ChannelClosedByBroker
from tests.conftest import ServerInfo, start_server

from hutch import portfile

# connections pinned to a worker must stay there to take the hop: connection locality (which would move
# them to their queue's worker) is tested in test_locality.py. The heartbeat timeout is 30 s for tests that
# are not about hang detection: a worker at nice 19 on a loaded CI machine answered ~1 s late (measured,
# docs/scaling.md), and 1.5 s once killed a healthy worker mid-suite
CONFIG = "workers.own_ports = true\nworkers.heartbeat_timeout = 30000\ncluster.tick_interval = 50\n" \
         "cluster.metadata_timeout = 5000\nworkers.locality = false\n"
# the hang-detection test's: the product's default, 5 s (beats every second), 2.5 times the worst gap
# measured under load, and short enough that a SIGSTOPped worker is replaced well within the test's waits
HANG_CONFIG = CONFIG.replace("workers.heartbeat_timeout = 30000", "workers.heartbeat_timeout = 5000")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def start_node(tmp: Path) -> ServerInfo:
    return start_server(tmp, "--workers", "2", config_text=CONFIG)


def until(cond: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def connect(info: ServerInfo, worker: int | None = None) -> pika.BlockingConnection:
    ports = portfile.read(info.data_dir)
    assert ports is not None
    port = info.amqp_port if worker is None else ports["listeners"][f"amqp_w{worker}"]
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))


def client_port(conn: pika.BlockingConnection) -> int:
    sock = conn._impl._transport._sock  # the client's own socket: its port names the connection at the node
    return int(sock.getsockname()[1])


def _inodes(port: int) -> set[str]:
    """Inodes of the node-side TCP sockets whose peer is the client's local `port`."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                found.add(fields[9])
    return found


def holders(info: ServerInfo, port: int) -> set[int]:
    """The workers (indexes) that hold the node's end of the client connection from local `port`."""
    inodes = _inodes(port)
    held: set[int] = set()
    for index in (0, 1):
        pid = worker_pid(info, index)
        if pid is None:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                held.add(index)
    return held


def worker_pid(info: ServerInfo, index: int) -> int | None:
    doc = portfile.read(info.data_dir / f"w{index}")
    return int(doc["pid"]) if doc is not None else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie of the supervisor's is gone as far as we care
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def queue_json(info: ServerInfo, queue: str) -> dict[str, Any]:
    req = urllib.request.Request(f"{info.mgmt_url}/api/queues/%2F/{queue}",
                                 headers={"Authorization": "Basic " + b64encode(b"guest:guest").decode()})
    with urllib.request.urlopen(req, timeout=10) as resp:
        doc: dict[str, Any] = json.load(resp)
        return doc


def worker_of(info: ServerInfo, queue: str) -> int:
    """The index of the worker `queue` lives in (its `node` is the node's one name; `worker` is hutch's)."""
    doc = queue_json(info, queue)
    assert doc["node"] == "test@localhost", doc["node"]
    return int(doc["worker"])


def get_one(ch: Any, queue: str) -> tuple[Any, Any, bytes]:
    """basic.get until a message comes (auto-ack)."""
    got = until(lambda: (lambda r: r if r[0] is not None else None)(ch.basic_get(queue, auto_ack=True)),
                what=f"a message in {queue}")
    return got


def declare(info: ServerInfo, queue: str, durable: bool = False) -> int:
    """Declare `queue` through the node's shared port; the index of the worker it was placed in."""
    with connect(info) as conn:
        conn.channel().queue_declare(queue, durable=durable)
    return worker_of(info, queue)


def drain(ch: Any, queue: str, count: int) -> list[bytes]:
    bodies: list[bytes] = []
    for method, _props, body in ch.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {len(bodies)} of {count} messages arrived"
        bodies.append(body)
        ch.basic_ack(method.delivery_tag)
        if len(bodies) == count:
            break
    ch.cancel()
    return bodies


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = start_node(tmp_path_factory.mktemp("workers"))
    yield info
    info.stop()


def test_one_node_to_clients_one_ports_file(node: ServerInfo) -> None:
    doc = portfile.read(node.data_dir)
    assert doc is not None and doc["pid"] == node.proc.pid and doc["node"] == "test@localhost"
    listeners = doc["listeners"]
    assert {"amqp", "management", "amqp_w0", "amqp_w1"} <= set(listeners) and "cluster" not in listeners
    for index in (0, 1):  # each worker's own file names the same shared port and its own one
        own = portfile.read(node.data_dir / f"w{index}")
        assert own is not None and own["pid"] != node.proc.pid
        assert own["listeners"]["amqp"] == listeners["amqp"]
        assert own["listeners"][f"amqp_w{index}"] == listeners[f"amqp_w{index}"]
    with connect(node) as conn:  # the shared port answers
        assert conn.channel().queue_declare("", exclusive=True).method.queue


def test_queues_are_spread_over_the_workers(node: ServerInfo) -> None:
    with connect(node, 0) as conn:
        ch = conn.channel()
        names = [f"spread-{i}" for i in range(4)]
        for name in names:
            ch.queue_declare(name, durable=True)
        homes = [worker_of(node, name) for name in names]
        assert sorted(homes) == [0, 0, 1, 1]  # the worker with fewest queues each time, not the declarer's
        transient = [ch.queue_declare(f"transient-{i}").method.queue for i in range(2)]
        assert sorted(worker_of(node, name) for name in transient) == [0, 1]  # placed as well
        for _ in range(3):  # exclusive queues: in their connection's worker, never a hop
            assert worker_of(node, ch.queue_declare("", exclusive=True).method.queue) == 0
        for name in [*names, *transient]:
            ch.queue_delete(name)


def test_publish_confirm_deliver_ack_reject_across_the_hop(node: ServerInfo) -> None:
    home = declare(node, "hop", durable=True)
    with connect(node, home) as owner, connect(node, 1 - home) as other:
        och = owner.channel()
        pub = other.channel()
        pub.confirm_delivery()  # each publish returns once worker 1 confirmed it (after its fsync)
        for i in range(20):
            pub.basic_publish("", "hop", b"m%d" % i, PERSISTENT)
        assert holders(node, client_port(other)) == {1 - home}  # workers.locality = false: no move
        assert och.queue_declare("hop", passive=True).method.message_count == 20
        con = other.channel()
        con.basic_qos(prefetch_count=5)
        method, _props, body = until(lambda: (lambda r: r if r[0] is not None else None)(con.basic_get("hop")),
                                     what="basic.get across the hop")
        assert body == b"m0"
        con.basic_reject(method.delivery_tag, requeue=True)
        seen: list[tuple[bytes, bool]] = []
        for method, _props, body in con.consume("hop", inactivity_timeout=10):
            assert method is not None
            seen.append((body, method.redelivered))
            if body == b"m1" and not any(b == b"m1" for b, _ in seen[:-1]):
                con.basic_reject(method.delivery_tag, requeue=False)  # dropped: no dead-letter exchange
            else:
                con.basic_ack(method.delivery_tag)
            if len(seen) == 20:
                break
        con.cancel()
        assert (b"m0", True) in seen  # the rejected one came back, marked redelivered
        assert sorted(b for b, _ in seen) == sorted(b"m%d" % i for i in range(20))
        assert until(lambda: och.queue_declare("hop", passive=True).method.message_count == 0, what="all settled")
        och.queue_delete("hop")


@contextmanager
def across_the_hop(info: ServerInfo, queue: str) -> Iterator[tuple[Any, Any, Any]]:
    """A new queue, a channel in its worker, and a connection and channel in the other worker."""
    home = declare(info, queue)
    with connect(info, home) as owner, connect(info, 1 - home) as other:
        yield owner.channel(), other, other.channel()


def test_held_and_single_records_keep_their_order_across_the_hop(node: ServerInfo) -> None:
    """Publishes and deliveries are held per loop turn and written as one record; a message larger than
    the batch limit goes alone, and a basic.get is a request: none of them may overtake what was held."""
    with across_the_hop(node, "hop-order") as (och, _other, ch):
        bodies = [b"%d:" % i + (b"x" * 70_000 if i % 7 == 3 else b"small") for i in range(60)]
        for body in bodies:
            ch.basic_publish("", "hop-order", body)
        _method, _props, first = ch.basic_get("hop-order", auto_ack=True)  # sent right behind the publishes
        assert first == bodies[0]
        assert drain(ch, "hop-order", 59) == bodies[1:]
        for body in bodies:  # now published in the queue's own worker, delivered across the hop
            och.basic_publish("", "hop-order", body)
        assert drain(ch, "hop-order", 60) == bodies
        och.queue_delete("hop-order")


def test_cancel_across_the_hop_leaves_the_rest_in_the_queue(node: ServerInfo) -> None:
    with across_the_hop(node, "hop-cancel") as (och, other, ch):
        ch.basic_qos(prefetch_count=1)
        got: list[bytes] = []
        tag = ch.basic_consume("hop-cancel", lambda c, m, p, b: got.append(b))
        och.basic_publish("", "hop-cancel", b"first")
        until(lambda: other.process_data_events(0.05) or got, what="the first delivery")
        ch.basic_cancel(tag)  # unacked: back to the queue when the channel closes
        for i in range(3):
            och.basic_publish("", "hop-cancel", b"later%d" % i)
        ch.close()
        assert until(lambda: och.queue_declare("hop-cancel", passive=True).method.message_count == 4,
                     what="every message back in the owner's queue")
        assert got == [b"first"]
        och.queue_delete("hop-cancel")


def test_queue_deleted_while_a_consumer_in_the_other_worker_consumes(node: ServerInfo) -> None:
    with across_the_hop(node, "hop-delete") as (och, other, ch):
        cancelled: list[Any] = []
        ch.add_on_cancel_callback(cancelled.append)
        ch.basic_consume("hop-delete", lambda c, m, p, b: c.basic_ack(m.delivery_tag))
        other.process_data_events(0.2)
        och.queue_delete("hop-delete")
        until(lambda: other.process_data_events(0.05) or cancelled, what="basic.cancel from the broker")
        assert cancelled[0].method.consumer_tag


def test_exclusive_queue_lives_in_its_connections_worker_and_goes_with_it(node: ServerInfo) -> None:
    owner = connect(node, 1)
    name = owner.channel().queue_declare("", exclusive=True).method.queue
    assert worker_of(node, name) == 1
    with connect(node, 0) as other:
        with pytest.raises(ChannelClosedByBroker) as locked:
            other.channel().queue_declare(name, passive=True)
        assert locked.value.reply_code == 405  # RESOURCE_LOCKED: another connection's exclusive queue
        owner.close()

        def gone() -> bool:
            try:
                other.channel().queue_declare(name, passive=True)
            except ChannelClosedByBroker as exc:
                assert exc.reply_code in (404, 405)
                return exc.reply_code == 404
            return False

        until(gone, what="the exclusive queue deleted with its connection")


def ports_file_names_worker(info: ServerInfo, index: int) -> bool:
    """The node's ports file names worker `index`'s current own port (rewritten after a restart)."""
    node_doc, own = portfile.read(info.data_dir), portfile.read(info.data_dir / f"w{index}")
    key = f"amqp_w{index}"
    return node_doc is not None and own is not None and node_doc["listeners"].get(key) == own["listeners"][key]


def test_worker_killed_or_hung_is_replaced_and_keeps_its_persistent_messages(tmp_path: Path) -> None:
    info = start_server(tmp_path, "--workers", "2", config_text=HANG_CONFIG)
    try:
        with connect(info, 0) as w0:
            for name in ("local", "kept"):  # one queue in each worker (fewest queues; a tie: the lower name)
                w0.channel().queue_declare(name, durable=True)
        assert (worker_of(info, "local"), worker_of(info, "kept")) == (0, 1)
        with connect(info, 1) as w1, connect(info, 0) as w0:
            pub = w0.channel()
            pub.confirm_delivery()
            for i in range(50):
                pub.basic_publish("", "kept", b"k%d" % i, PERSISTENT)  # confirmed by worker 1
            victim = worker_pid(info, 1)
            assert victim is not None
            os.kill(victim, signal.SIGKILL)
            until(lambda: not alive(victim), what="worker 1 gone")
            with pytest.raises(AMQPConnectionError):  # its connections are gone with it
                w1.channel()
                w1.process_data_events(1)
            pub.basic_publish("", "local", b"still served", PERSISTENT)  # worker 0 goes on serving
            assert get_one(pub, "local")[2] == b"still served"
            # the management API answers without the worker that is down (or restarting): not an error
            req = urllib.request.Request(f"{info.mgmt_url}/api/connections", headers={
                "Authorization": "Basic " + b64encode(b"guest:guest").decode()})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200 and len(json.load(resp)) >= 1  # worker 0's `w0` at least
        until(lambda: worker_pid(info, 1) not in (None, victim), what="worker 1 restarted")
        until(lambda: ports_file_names_worker(info, 1), what="the ports file naming the new worker 1")
        with connect(info, 1) as again:
            assert sorted(drain(again.channel(), "kept", 50)) == sorted(b"k%d" % i for i in range(50))

        hung = worker_pid(info, 0)
        assert hung is not None
        os.kill(hung, signal.SIGSTOP)  # no heartbeat from now on: killed and replaced
        until(lambda: not alive(hung), what="the hung worker killed")
        until(lambda: worker_pid(info, 0) not in (None, hung), what="worker 0 replaced")
        assert "sent no heartbeat" in info.log()
        until(lambda: ports_file_names_worker(info, 0), what="the ports file naming the new worker 0")
        with connect(info) as shared:  # the node's shared port reaches every queue from either worker
            shared.channel().queue_declare("kept", passive=True)
            shared.channel().queue_declare("local", passive=True)
    finally:
        assert info.stop() == 0  # SIGTERM to the supervisor stops every worker cleanly


def test_supervisor_killed_leaves_no_worker_and_a_restart_puts_every_queue_back(tmp_path: Path) -> None:
    info = start_node(tmp_path)
    with connect(info, 1) as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        for queue in ("q-a", "q-b", "q-c"):
            ch.queue_declare(queue, durable=True)
            ch.basic_publish("", queue, queue.encode(), PERSISTENT)
        homes = {queue: worker_of(info, queue) for queue in ("q-a", "q-b", "q-c")}
    assert set(homes.values()) == {0, 1}
    workers = [worker_pid(info, 0), worker_pid(info, 1)]
    assert all(workers)
    info.stop(signal.SIGKILL)
    for pid in workers:
        assert pid is not None
        until(lambda pid=pid: not alive(pid), what=f"worker {pid} gone with its supervisor")
    info = start_node(tmp_path)
    try:
        for queue, worker in homes.items():
            assert worker_of(info, queue) == worker
        with connect(info) as conn:
            ch = conn.channel()
            for queue in homes:
                assert ch.basic_get(queue, auto_ack=True)[2] == queue.encode()
    finally:
        assert info.stop() == 0
    assert portfile.read(info.data_dir) is None  # a clean stop removes the node's ports file


def test_direct_reply_to_across_the_hop(node: ServerInfo) -> None:
    with connect(node, 0) as requester, connect(node, 1) as server:
        rch, sch = requester.channel(), server.channel()
        sch.queue_declare("rpc-requests")
        replies: list[bytes] = []
        rch.basic_consume("amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(b), auto_ack=True)
        rch.basic_publish("", "rpc-requests", b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
        _method, props, body = get_one(sch, "rpc-requests")
        assert body == b"ping" and props.reply_to.startswith("amq.rabbitmq.reply-to.")
        sch.basic_publish("", props.reply_to, b"pong")  # worker 1 sends it on to the requester's worker
        until(lambda: requester.process_data_events(0.05) or replies, what="the reply in worker 0")
        assert replies == [b"pong"]
        sch.queue_delete("rpc-requests")
