"""Another worker's management agent over the worker link (runtime/agent_link.py), without processes.

A fake cluster carries each `AgentQuery` through the records' codec (msgpack both ways) to the handler
`serve_agent` registered, as the worker link does; the remote agent must answer what the agent it asks
answers, answer as an agent holding nothing when the peer is down or silent, and the answerer must refuse
anything that is not an agent method with arguments of the right shape.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import msgpack
import pytest

from hutch.cluster import messages as cm
from hutch.runtime.agent_link import METHODS, RemoteAgent, WorkersAgent, empty_samples, serve_agent


class Transport:
    def __init__(self) -> None:
        self.up = True

    def connected(self, _peer: str) -> bool:
        return self.up


class FakeCluster:
    """Requests through the codec to the registered handler; `silent` makes every call time out."""

    def __init__(self) -> None:
        self.registry = cm.Registry()
        self.transport = Transport()
        self.silent = False

    def register(self, kind: Any, handler: Any) -> None:
        self.registry.register(kind, handler)

    async def call(self, peer: str, request: Any, timeout: float = 5.0) -> Any:
        if self.silent:
            raise TimeoutError(f"no reply from node {peer!r} within {timeout} s")
        value = msgpack.unpackb(cm.encode(request), raw=False)
        result = self.registry.handle("w0", value)
        if inspect.isawaitable(result):
            result = await result
        return msgpack.unpackb(msgpack.packb(result), raw=False)


class Held:
    """An agent holding one connection (`node#w1`) with one channel and one consumer of queue q."""

    name = "node#w1"

    def __init__(self) -> None:
        self.closed: list[tuple[str, str]] = []
        self.asked: list[Any] = []

    async def counts(self) -> dict[str, int]:
        return {"connections": 1, "channels": 1, "consumers": 1}

    async def connections(self) -> list[dict[str, Any]]:
        return [{"name": "c1", "node": self.name, "user": "guest"}]

    async def channels(self, connection: str | None = None) -> list[dict[str, Any]]:
        return [{"name": "c1 (1)", "node": self.name}] if connection in (None, "c1") else []

    async def channel(self, name: str) -> dict[str, Any] | None:
        return {"name": name, "node": self.name} if name == "c1 (1)" else None

    async def consumers(self, queue: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        self.asked.append(queue)
        return [{"consumer_tag": "t", "channel_details": {"node": self.name}}]

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        return [{"name": "q", "vhost": "/"}]

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        self.asked.append(keys)
        return [{"name": n, "vhost": v, "node": self.name} for v, n in keys]

    async def samples(self) -> dict[str, Any]:
        return {"queues": [["/", "q", 1, 0, 0, 0, 0, 0, 0]], "channels": [["c1 (1)", "/", [0], []]],
                "connections": [["c1", "/", 10, 20]], "closed": [1, 2], "churn": {"connection_created": 1}}

    async def process_figures(self) -> dict[str, int]:
        return {"mem_used": 100, "fd_used": 7, "sockets_used": 1, "proc_used": 2, "io_sync_count": 3,
                "io_sync_batch_count": 1}

    async def delayed_counts(self) -> list[list[Any]]:
        return [["/", "dx", 2]]

    async def purge_queue(self, vhost: str, name: str) -> int | None:
        return 3 if name == "q" else None

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        return "in_use" if if_unused else "deleted"

    async def close_connection(self, name: str, reason: str) -> bool:
        self.closed.append((name, reason))
        return name == "c1"

    async def close_user_connections(self, user: str, reason: str) -> int:
        return 1 if user == "guest" else 0


def remote() -> tuple[RemoteAgent, FakeCluster, Held]:
    cluster, held = FakeCluster(), Held()
    serve_agent(cluster, held)  # type: ignore[arg-type]
    return RemoteAgent(cluster, held.name), cluster, held  # type: ignore[arg-type]


def test_the_remote_agent_answers_what_the_agent_it_asks_answers() -> None:
    agent, _cluster, held = remote()

    async def run() -> None:
        for method in ("counts", "connections", "samples", "process_figures", "delayed_counts"):
            assert await getattr(agent, method)() == await getattr(held, method)()
        assert await agent.channels("c1") == await held.channels("c1")
        assert await agent.channel("c1 (1)") == {"name": "c1 (1)", "node": "node#w1"}
        assert await agent.channel("nope") is None
        assert await agent.consumers(("/", "q")) == await held.consumers(("/", "q"))
        assert held.asked[0] == ("/", "q")  # a (vhost, name) key arrives as the tuple the agent takes
        assert await agent.queue_details([("/", "a"), ("/", "b")]) == await held.queue_details([("/", "a"), ("/", "b")])
        assert held.asked[2] == [("/", "a"), ("/", "b")]
        assert await agent.purge_queue("/", "q") == 3 and await agent.purge_queue("/", "x") is None
        assert await agent.delete_queue("/", "q", True, False) == "in_use"
        assert await agent.close_connection("c1", "why") is True and held.closed == [("c1", "why")]
        assert await agent.close_user_connections("guest", "why") == 1

    asyncio.run(run())


def test_a_worker_down_or_silent_answers_as_an_agent_holding_nothing() -> None:
    agent, cluster, held = remote()

    async def empties() -> list[Any]:
        return [await agent.counts(), await agent.connections(), await agent.channels(), await agent.channel("c1 (1)"),
                await agent.consumers(), await agent.queues(), await agent.queue_details([("/", "q")]),
                await agent.samples(), await agent.purge_queue("/", "q"), await agent.delete_queue("/", "q", False, False),
                await agent.close_connection("c1", "r"), await agent.close_user_connections("guest", "r"),
                await agent.delayed_counts()]

    expected = [{}, [], [], None, [], [], [], empty_samples(), None, "absent", False, 0, []]
    cluster.transport.up = False
    assert asyncio.run(empties()) == expected
    cluster.transport.up, cluster.silent = True, True
    assert asyncio.run(empties()) == expected
    assert held.closed == []  # nothing reached the agent


@pytest.mark.parametrize(("method", "args"), [
    ("__init__", []), ("node", []), ("counts", [1]), ("channel", [None]), ("consumers", [["/"]]),
    ("queue_details", [[["/", 1]]]), ("queues", [[1]]), ("delete_queue", ["/", "q", 1, 0]),
    ("close_connection", ["c1"]), ("queue_details", [[["/", "q"]] * 10_001]),
])
def test_the_answerer_refuses_anything_but_an_agent_method_with_its_arguments(method: str, args: list[Any]) -> None:
    cluster, held = FakeCluster(), Held()
    serve_agent(cluster, held)  # type: ignore[arg-type]
    with pytest.raises(cm.MalformedMessage):
        asyncio.run(cluster.call("node#w1", cm.AgentQuery(method, args)))
    assert held.closed == [] and held.asked == []
    assert set(METHODS) == {"counts", "connections", "channels", "channel", "consumers", "queues", "queue_details",
                            "samples", "metric_samples", "process_figures", "purge_queue", "delete_queue",
                            "close_connection", "close_user_connections", "delayed_counts", "stream_connections",
                            "stream_groups", "stream_tracking", "close_stream_connection"}


def test_the_node_of_workers_names_every_object_as_the_node_and_lists_queues_once() -> None:
    agent, _cluster, held = remote()

    class Own(Held):
        name = "node#w0"

    node = WorkersAgent("node", [Own(), agent])

    async def run() -> None:
        assert {c["node"] for c in await node.connections()} == {"node"}
        assert [c["channel_details"]["node"] for c in await node.consumers()] == ["node", "node"]
        assert (await node.counts())["connections"] == 2
        assert await node.queues() == [{"name": "q", "vhost": "/"}]  # worker 0's, which holds every queue
        assert [(q["node"], q["worker"]) for q in await node.queue_details([("/", "q")])] == [("node", 0)]
        samples = await node.samples()
        assert len(samples["queues"]) == 1 and len(samples["connections"]) == 2 and samples["closed"] == [2, 4]
        assert await node.close_connection("c1", "r") is True
        # the node's process figures are every worker's, summed (GET /api/nodes of a node of workers)
        figures = await node.process_figures()
        assert figures["mem_used"] == 200 and figures["sockets_used"] == 2 and figures["io_sync_count"] == 6
        # an x-delayed-message exchange's messages_delayed: what each worker holds, summed
        assert await node.delayed_counts() == [["/", "dx", 4]]
        # a purge asks every worker (the home purges; in a real node a stand-in answers 0)
        assert await node.purge_queue("/", "q") == 6 and await node.purge_queue("/", "x") is None

    asyncio.run(run())


def test_a_queues_details_are_its_homes_answer_and_the_stand_in_only_while_the_home_is_silent() -> None:
    """Worker 0 holds a stand-in of a queue homed in worker 1 (its `node` names worker 1, its figures as
    last pushed); the details of the queue are worker 1's own answer, and the stand-in's when worker 1
    does not answer."""
    class StandIn(Held):
        name = "node#w0"

        async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
            return [{"name": n, "vhost": v, "node": "node#w1", "messages": 0} for v, n in keys]

    class Home(Held):
        async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
            return [{"name": n, "vhost": v, "node": self.name, "messages": 5} for v, n in keys]

    cluster = FakeCluster()
    serve_agent(cluster, Home())  # type: ignore[arg-type]  # worker 1 answers with its own queue
    node = WorkersAgent("node", [StandIn(), RemoteAgent(cluster, "node#w1")])  # type: ignore[arg-type]
    got = asyncio.run(node.queue_details([("/", "q")]))
    assert [(q["node"], q["worker"], q["messages"]) for q in got] == [("node", 1, 5)]

    cluster.silent = True
    silent = WorkersAgent("node", [StandIn(), RemoteAgent(cluster, "node#w1")])  # type: ignore[arg-type]
    got = asyncio.run(silent.queue_details([("/", "q")]))
    assert [(q["node"], q["worker"], q["messages"]) for q in got] == [("node", 1, 0)]
