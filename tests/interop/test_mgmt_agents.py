"""Two management agents in one process, listed through the gatherer, look like one node.

Two nodes' worth of objects (two hutch nodes on one event loop, as two workers of one node will be)
each answer through their own `LocalAgent` (runtime/agent.py); a `GatheringAgent` (runtime/gather.py)
over both is what the management API of a node of two workers asks. Real pika clients hold the
connections, channels and consumers; a close command through the gatherer reaches the client of the
node that holds the connection, with RabbitMQ's 320 CONNECTION_FORCED.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pika
import pytest

from hutch.config import Config
from hutch.core.auth import AuthStore
from hutch.runtime.app import build_node, start_node, stop_node
from hutch.runtime.gather import GatheringAgent

T = TypeVar("T")
NODE = "hutch@gathered"


class TwoWorkers:
    """Two nodes on one event loop in a background thread, and a gatherer over their agents."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="two-agents", daemon=True)
        self.nodes: list[Any] = []
        self.servers: list[Any] = []

    def run(self, coro: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    def start(self) -> TwoWorkers:
        self.thread.start()

        async def boot(name: str) -> None:
            config = Config(amqp_host="127.0.0.1", amqp_port=0, management_port=0, node_name=name)
            auth = AuthStore(scrypt_n=16)
            auth.bootstrap(config.default_user, config.default_pass, config.default_vhost)
            node = build_node(config, auth=auth, monitor_resources=False)
            self.servers.append(await start_node(node))
            self.nodes.append(node)

        for name in ("worker1@gathered", "worker2@gathered"):
            self.run(boot(name))
        self.gatherer = GatheringAgent(NODE, [n.agent for n in self.nodes])
        return self

    def stop(self) -> None:
        for node, server in zip(self.nodes, self.servers, strict=True):
            self.run(stop_node(node, server))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def workers() -> Iterator[TwoWorkers]:
    w = TwoWorkers().start()
    try:
        yield w
    finally:
        w.stop()


def _connect(node: Any, name: str) -> pika.BlockingConnection:
    params = pika.ConnectionParameters("127.0.0.1", node.amqp_port, client_properties={"connection_name": name})
    return pika.BlockingConnection(params)


def test_two_agents_through_the_gatherer_look_like_one_node(workers: TwoWorkers) -> None:
    first, second = (_connect(n, f"client-{i}") for i, n in enumerate(workers.nodes))
    try:
        for conn, queue in ((first, "q-one"), (second, "q-two")):
            ch = conn.channel()
            ch.queue_declare(queue)
            ch.basic_consume(queue, lambda *_: None, consumer_tag=f"ctag-{queue}")
        second.channel()  # a second channel on the second worker's connection
        g = workers.gatherer

        conns = workers.run(g.connections())
        assert sorted(c["user_provided_name"] for c in conns) == ["client-0", "client-1"]
        assert {c["node"] for c in conns} == {NODE}
        channels = workers.run(g.channels())
        assert len(channels) == 3 and {c["node"] for c in channels} == {NODE}
        consumers = workers.run(g.consumers())
        assert sorted(c["consumer_tag"] for c in consumers) == ["ctag-q-one", "ctag-q-two"]
        assert {c["channel_details"]["node"] for c in consumers} == {NODE}
        [two] = workers.run(g.consumers(("/", "q-two")))
        assert two["queue"] == {"name": "q-two", "vhost": "/"}
        lights = workers.run(g.queues(["/"]))
        assert sorted(q["name"] for q in lights) == ["q-one", "q-two"]
        details = workers.run(g.queue_details([("/", "q-two"), ("/", "q-one"), ("/", "absent")]))
        assert [(q["name"], q["node"], q["consumers"]) for q in details] == [("q-two", NODE, 1), ("q-one", NODE, 1)]
        idle = second.channel()
        idle.queue_declare("q-idle")
        for body in (b"a", b"b"):
            idle.basic_publish("", "q-idle", body)
        idle.queue_declare("q-idle", passive=True)  # a round trip: both publishes are in
        assert workers.run(g.purge_queue("/", "q-idle")) == 2
        assert workers.run(g.purge_queue("/", "absent")) is None
        assert workers.run(g.delete_queue("/", "q-two", True, False)) == "in_use"
        assert workers.run(g.delete_queue("/", "q-idle", False, False)) == "deleted"
        assert workers.run(g.delete_queue("/", "q-idle", False, False)) == "absent"
        idle.close()
        counts = workers.run(g.counts())
        assert (counts["connections"], counts["channels"], counts["consumers"]) == (2, 3, 2)  # idle closed
        samples = workers.run(g.samples())  # what the statistics collector samples, for both workers
        assert sorted(row[0] for row in samples["connections"]) == sorted(c["name"] for c in conns)
        assert len(samples["channels"]) == 3
        assert {(row[0], row[1]) for row in samples["queues"]} >= {("/", "q-one"), ("/", "q-two")}
        detail = workers.run(g.channel(channels[0]["name"]))
        assert detail is not None and detail["node"] == NODE
        assert {c["channel_details"]["node"] for c in detail["consumer_details"]} <= {NODE}

        name = next(c["name"] for c in conns if c["user_provided_name"] == "client-1")
        assert workers.run(g.close_connection(name, "moved to another worker")) is True
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            second.process_data_events(time_limit=5)
            second.sleep(5)  # the close arrives while the client waits
        assert closed.value.reply_code == 320
        assert closed.value.reply_text == "CONNECTION_FORCED - moved to another worker"
        first.process_data_events(time_limit=0)
        assert first.is_open
        left = [c["user_provided_name"] for c in workers.run(workers.nodes[0].agent.connections())]
        assert left == ["client-0"]  # the first worker's connection was not touched
    finally:
        for conn in (first, second):
            if conn.is_open:
                conn.close()
