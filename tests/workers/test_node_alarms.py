"""Memory and disk alarms are node-wide in a node of workers: a worker reports its own alarms over its
control socket, the supervisor tells every worker the union (runtime/workers/supervisor.py, link.py), and
a worker blocks its publishers while any worker has an alarm (Node.set_worker_alarms), as one RabbitMQ
alarm blocks publishers on every node of a cluster.

The supervisor's union is tested on real socket pairs (its `_readable` on the control sockets); what a
client sees is tested with pika against an in-process node told of another worker's alarm.
"""

from __future__ import annotations

import asyncio
import socket

import pika
import pytest
from tests.interop.inproc import InProcNode
from tests.interop.test_alarms import wait_for

from hutch.config import Config
from hutch.runtime.workers import control
from hutch.runtime.workers.supervisor import Supervisor


def told(sock: socket.socket) -> list[list[str]]:
    """Every `node_alarms` message waiting on a worker's end of its control socket."""
    out = []
    while True:
        try:
            data = sock.recv(control.MAX_MESSAGE_BYTES)
        except BlockingIOError:
            return out
        out.append(control.decode(data)["node_alarms"])


@pytest.mark.asyncio
async def test_the_supervisor_tells_every_worker_the_union_of_their_alarms() -> None:
    sup = Supervisor(Config(), [], 3)
    sup._loop = asyncio.get_running_loop()
    ends = []
    for w in sup.workers:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.setblocking(False)
        theirs.setblocking(False)
        w.control = ours
        ends.append(theirs)
    try:
        ends[1].send(control.encode("alarms", ["memory"]))
        sup._readable(sup.workers[1])
        assert [told(e) for e in ends] == [[["memory"]]] * 3  # worker 1's alarm, to every worker
        ends[2].send(control.encode("alarms", ["disk", "bogus"]))
        sup._readable(sup.workers[2])
        assert [told(e) for e in ends] == [[["disk", "memory"]]] * 3  # an unknown name is dropped
        ends[2].send(control.encode("alarms", ["disk"]))  # no change: nobody is told again
        sup._readable(sup.workers[2])
        assert [told(e) for e in ends] == [[]] * 3
        ends[1].send(control.encode("alarms", []))
        sup._readable(sup.workers[1])
        assert [told(e) for e in ends] == [[["disk"]]] * 3
        sup._close_control(sup.workers[2])  # worker 2 gone: its alarm goes with it
        assert [told(e) for e in ends[:2]] == [[[]]] * 2
    finally:
        for w in sup.workers:
            if w.control is not None:
                w.control.close()
        for e in ends:
            e.close()


def test_another_workers_alarm_blocks_publishers_here_until_it_clears() -> None:
    with InProcNode(monitor_resources=False) as node:
        publisher = pika.BlockingConnection(pika.ConnectionParameters(port=node.amqp_port))
        events: list[str] = []
        publisher.add_on_connection_blocked_callback(lambda _c, m: events.append(m.method.reason))
        publisher.add_on_connection_unblocked_callback(lambda _c, _m: events.append("unblocked"))
        ch = publisher.channel()
        ch.queue_declare("worker-alarm")
        ch.basic_publish("", "worker-alarm", b"before")
        node.call(node.node.set_worker_alarms, {"disk"})  # another worker is low on disk
        wait_for(lambda: events == ["low on disk"], publisher)
        ch.basic_publish("", "worker-alarm", b"during")
        publisher.process_data_events(time_limit=0.3)
        assert node.call(lambda: node.node.vhosts["/"].queues["worker-alarm"].message_count) == 1
        node.call(node.node.set_alarm, "memory")  # and this one on memory: still blocked
        node.call(node.node.set_worker_alarms, set())  # the other worker's cleared
        publisher.process_data_events(time_limit=0.3)
        assert events == ["low on disk"]
        node.call(node.node.clear_alarm, "memory")
        wait_for(lambda: events == ["low on disk", "unblocked"], publisher)
        wait_for(lambda: node.call(lambda: node.node.vhosts["/"].queues["worker-alarm"].message_count) == 2,
                 publisher)
        publisher.close()
