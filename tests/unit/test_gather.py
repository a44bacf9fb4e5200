"""The gatherer (runtime/gather.py): several management agents' answers merged into one node's.

Pure: fake agents hold plain data, as a worker's agent answers over its link. The property: however
the objects are spread over N agents, the gatherer answers what one agent holding all of them would,
under the gatherer's node name.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.core.counters import CHANNEL_METRIC_FIELDS
from hutch.runtime.gather import (
    GatheringAgent,
    merge_counts,
    merge_lists,
    merge_metric_samples,
    merge_samples,
    renamed,
)

NODE = "rabbit@host"


class FakeAgent:
    """An agent answering from plain data: connections, channels and consumers it holds."""

    def __init__(self, name: str, conns: list[dict[str, Any]], channels: list[dict[str, Any]],
                 consumers: list[dict[str, Any]], counts: dict[str, int]) -> None:
        self._name = name
        self.conns, self.chans, self.cons, self._counts = conns, channels, consumers, counts
        self.queue_objs: list[dict[str, Any]] = []  # full queues; the light ones are their first fields
        self.closed: list[str] = []
        self.delayed: list[list[Any]] = []  # [vhost, exchange, held]

    @property
    def name(self) -> str:
        return self._name

    async def counts(self) -> dict[str, int]:
        return dict(self._counts)

    async def connections(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.conns)

    async def channels(self, connection: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(c) for c in self.chans
                if connection is None or c["connection_details"]["name"] == connection]

    async def channel(self, name: str) -> dict[str, Any] | None:
        found = [c for c in self.chans if c["name"] == name]
        return copy.deepcopy(found[0]) if found else None

    async def consumers(self, queue: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(c) for c in self.cons
                if queue is None or (c["queue"]["vhost"], c["queue"]["name"]) == queue]

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        return [{"name": q["name"], "vhost": q["vhost"], "messages": q["messages"]} for q in self.queue_objs
                if vhosts is None or q["vhost"] in vhosts]

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        held = {(q["vhost"], q["name"]): q for q in self.queue_objs}
        return [copy.deepcopy(held[k]) for k in keys if k in held]

    async def delayed_counts(self) -> list[list[Any]]:
        return [list(row) for row in self.delayed]

    async def purge_queue(self, vhost: str, name: str) -> int | None:
        held = [q for q in self.queue_objs if (q["vhost"], q["name"]) == (vhost, name)]
        return held[0]["messages"] if held else None

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        held = [q for q in self.queue_objs if (q["vhost"], q["name"]) == (vhost, name)]
        if not held:
            return "absent"
        if if_empty and held[0]["messages"]:
            return "not_empty"
        self.queue_objs.remove(held[0])
        return "deleted"

    async def close_connection(self, name: str, reason: str) -> bool:
        if any(c["name"] == name for c in self.conns):
            self.closed.append(name)
            return True
        return False

    async def close_user_connections(self, user: str, reason: str) -> int:
        mine = [c["name"] for c in self.conns if c["user"] == user]
        self.closed += mine
        return len(mine)


def _connection(i: int, user: str, node: str) -> dict[str, Any]:
    return {"name": f"127.0.0.1:{1000 + i} -> 127.0.0.1:5672", "user": user, "vhost": "/", "node": node,
            "recv_oct": i, "send_oct": 2 * i}


def _channel(conn: dict[str, Any], number: int) -> dict[str, Any]:
    return {"name": f"{conn['name']} ({number})", "user": conn["user"], "vhost": "/", "node": conn["node"],
            "connection_details": {"name": conn["name"]}, "message_stats": {"publish": number},
            "consumer_details": [{"consumer_tag": "t", "channel_details": {"node": conn["node"]}}]}


def _consumer(ch: dict[str, Any], queue: str) -> dict[str, Any]:
    return {"consumer_tag": f"ctag-{ch['name']}", "queue": {"name": queue, "vhost": "/"},
            "channel_details": {"name": ch["name"], "node": ch["node"]}}


world = st.lists(  # per connection: (owning agent, user, channel count, queue its consumers use)
    st.tuples(st.integers(0, 3), st.sampled_from(["guest", "alice"]), st.integers(0, 2), st.sampled_from("qr")),
    max_size=12)


def _agents(spec: list[tuple[int, str, int, str]], n: int) -> tuple[list[FakeAgent], FakeAgent]:
    """`n` agents holding the spec's objects by owner, and one agent holding everything."""
    per: list[tuple[list[Any], list[Any], list[Any]]] = [([], [], []) for _ in range(n)]
    everything: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
    queues: list[list[dict[str, Any]]] = [[] for _ in range(n)]
    everything_queues: list[dict[str, Any]] = []
    for i, (owner, user, channels, queue) in enumerate(spec):
        agent = owner % n
        conn = _connection(i, user, f"worker{agent}@host")
        conns, chans, cons = per[agent]
        conns.append(conn)
        queues[agent].append({"name": f"q{i}", "vhost": "/" if i % 2 else "v", "messages": i,
                              "node": f"worker{agent}@host"})
        everything_queues.append({"name": f"q{i}", "vhost": "/" if i % 2 else "v", "messages": i, "node": NODE})
        whole = _connection(i, user, NODE)
        everything[0].append(whole)
        for number in range(1, channels + 1):
            chans.append(_channel(conn, number))
            cons.append(_consumer(_channel(conn, number), queue))
            everything[1].append(_channel(whole, number))
            everything[2].append(_consumer(_channel(whole, number), queue))
    agents = [FakeAgent(f"worker{k}@host", *per[k], {"connections": len(per[k][0]), "channels": len(per[k][1]),
                                                      "publish": 3 * k}) for k in range(n)]
    for agent, held in zip(agents, queues, strict=True):
        agent.queue_objs = held
    one = FakeAgent(NODE, *everything, merge_counts(a._counts for a in agents))
    one.queue_objs = everything_queues
    # the single agent's lists are in the gatherer's order: agent by agent
    order = {c["name"]: k for k, a in enumerate(agents) for c in a.conns}
    one.conns.sort(key=lambda c: order[c["name"]])
    queue_order = {q["name"]: k for k, a in enumerate(agents) for q in a.queue_objs}
    one.queue_objs.sort(key=lambda q: queue_order[q["name"]])
    one.chans.sort(key=lambda c: order[c["connection_details"]["name"]])
    one.cons.sort(key=lambda c: order[c["channel_details"]["name"].rsplit(" (", 1)[0]])
    return agents, one


@settings(max_examples=60, deadline=None)
@given(world, st.integers(1, 4))
def test_n_agents_gathered_answer_as_one_agent_holding_everything(spec, n):
    agents, one = _agents(spec, n)
    gatherer = GatheringAgent(NODE, agents)

    async def both() -> None:
        assert await gatherer.counts() == await one.counts()
        assert await gatherer.connections() == await one.connections()
        assert await gatherer.channels() == await one.channels()
        assert await gatherer.consumers() == await one.consumers()
        assert await gatherer.consumers(("/", "q")) == await one.consumers(("/", "q"))
        assert await gatherer.queues() == await one.queues()
        assert await gatherer.queues(["v"]) == await one.queues(["v"])
        keys = [(q["vhost"], q["name"]) for q in reversed(one.queue_objs)] + [("/", "missing")]
        assert await gatherer.queue_details(keys) == await one.queue_details(keys)
        for conn in one.conns[:3]:
            assert await gatherer.channels(conn["name"]) == await one.channels(conn["name"])
        for ch in one.chans[:3]:
            assert await gatherer.channel(ch["name"]) == await one.channel(ch["name"])
        assert await gatherer.channel("nope (1)") is None
        for key in keys:
            assert await gatherer.purge_queue(*key) == await one.purge_queue(*key)
            assert await gatherer.delete_queue(*key, False, True) == await one.delete_queue(*key, False, True)
        assert await gatherer.queues() == await one.queues()
        assert await gatherer.close_user_connections("alice", "bye") == await one.close_user_connections("alice",
                                                                                                         "bye")
        assert sorted(n for a in agents for n in a.closed) == sorted(one.closed)

    asyncio.run(both())


def test_a_command_reaches_the_agent_that_holds_the_object():
    agents, _one = _agents([(0, "guest", 1, "q"), (1, "guest", 0, "q")], 2)
    gatherer = GatheringAgent(NODE, agents)
    name = agents[1].conns[0]["name"]
    assert asyncio.run(gatherer.close_connection(name, "bye")) is True
    assert agents[1].closed == [name] and agents[0].closed == []
    assert asyncio.run(gatherer.close_connection("missing", "bye")) is False


def test_counts_sum_key_by_key_and_a_missing_key_counts_zero():
    assert merge_counts([{"a": 1, "b": 2}, {"b": 3, "c": 4}, {}]) == {"a": 1, "b": 5, "c": 4}
    assert merge_counts([]) == {}


def test_a_node_field_naming_another_cluster_member_is_kept():
    """A queue homed on another node of the cluster keeps that node's name; the agents' become one."""
    objs = [[{"name": "q1", "node": "w1@h"}], [{"name": "q2", "node": "other@h"}]]
    assert merge_lists(objs, frozenset({"w1@h", "w2@h"}), NODE) == [{"name": "q1", "node": NODE},
                                                                    {"name": "q2", "node": "other@h"}]


def test_renaming_keeps_the_key_order():
    obj = {"name": "c", "node": "w1@h", "host": "x"}
    assert list(renamed(obj, frozenset({"w1@h"}), NODE)) == ["name", "node", "host"]


samples_of_one_agent = st.fixed_dictionaries({
    "queues": st.lists(st.tuples(st.sampled_from(["/", "v"]), st.text("qr", min_size=1, max_size=3),
                                 st.integers(0, 9)).map(lambda t: [t[0], t[1], t[2], 0, t[2], 0, 0, 0, 0]),
                       max_size=4),
    "channels": st.lists(st.integers(0, 99).map(lambda i: [f"c ({i})", "/", [i] * 11, [["/", "x", i, i]]]),
                         max_size=3),
    "connections": st.lists(st.integers(0, 99).map(lambda i: [f"c{i}", None if i % 5 == 0 else "/", i, i]),
                            max_size=3),
    "closed": st.lists(st.integers(0, 50), min_size=11, max_size=11),
    "churn": st.dictionaries(st.sampled_from(["connections_opened", "queues_created"]), st.integers(0, 9)),
})


@settings(max_examples=60, deadline=None)
@given(st.lists(samples_of_one_agent, min_size=1, max_size=4))
def test_the_statistics_samples_of_n_agents_are_those_of_one_holding_everything(answers):
    merged = merge_samples(answers)
    for kind in ("queues", "channels", "connections"):
        assert merged[kind] == [row for a in answers for row in a[kind]]
    assert merged["closed"] == [sum(a["closed"][i] for a in answers) for i in range(11)]
    for key in ("connections_opened", "queues_created"):
        assert merged["churn"].get(key, 0) == sum(a["churn"].get(key, 0) for a in answers)


def test_an_agent_none_of_whose_channels_closed_yet_adds_nothing_to_the_closed_totals():
    """Found on 3 nodes of 2 workers: one worker answers an empty row of closed-channel counters (none of
    its channels closed yet), another a full one; the merge indexed past the empty row and the node's
    statistics sampling failed every 5 s."""
    empty = {"queues": [], "channels": [], "connections": [], "closed": [], "churn": {}}
    full = {**empty, "closed": list(range(11))}
    assert merge_samples([empty, full])["closed"] == list(range(11))
    assert merge_samples([full, empty])["closed"] == list(range(11))


metric_samples_of_one_agent = st.fixed_dictionaries({
    "connections": st.lists(st.integers(0, 99).map(lambda i: [f"c{i}", i, i, i % 3]), max_size=3),
    "channels": st.lists(st.integers(0, 99).map(lambda i: [f"c{i} (1)", "/", [i] * len(CHANNEL_METRIC_FIELDS)]),
                         max_size=3),
    "closed": st.dictionaries(st.sampled_from(["stat_publish", "stat_routed", "stat_ack"]), st.integers(0, 9)),
    "churn": st.dictionaries(st.sampled_from(["connections_opened", "channels_closed"]), st.integers(0, 9)),
    "streams": st.lists(st.integers(0, 99).map(lambda i: ["/", f"s{i}", i % 4, i]), max_size=3),
    "stream_protocol": st.one_of(st.just([]), st.lists(st.integers(0, 9), min_size=6, max_size=6)),
})


@settings(max_examples=60, deadline=None)
@given(st.lists(metric_samples_of_one_agent, min_size=1, max_size=4))
def test_the_prometheus_samples_of_n_agents_are_those_of_one_holding_everything(answers):
    merged = merge_metric_samples(answers)
    for kind in ("connections", "channels"):
        assert merged[kind] == [row for a in answers for row in a[kind]]
    streams = {(v, n) for a in answers for v, n, _segments, _lag in a["streams"]}  # each stream once
    assert sorted((v, n) for v, n, _s, _l in merged["streams"]) == sorted(streams)
    for v, n, segments, lag in merged["streams"]:
        rows = [r for a in answers for r in a["streams"] if (r[0], r[1]) == (v, n)]
        assert (segments, lag) == (max(r[2] for r in rows), max(r[3] for r in rows))
    counted = [a["stream_protocol"] for a in answers if a["stream_protocol"]]
    assert merged["stream_protocol"] == ([sum(a[i] for a in counted) for i in range(6)] if counted else [])
    for kind, keys in (("closed", ("stat_publish", "stat_routed", "stat_ack")),
                       ("churn", ("connections_opened", "channels_closed"))):
        for key in keys:
            assert merged[kind].get(key, 0) == sum(a[kind].get(key, 0) for a in answers)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["/", "v"]), st.sampled_from(["dx", "dy", "dz"]),
                                   st.integers(1, 1000)), unique_by=lambda r: r[:2]), min_size=1, max_size=4))
def test_gathered_delayed_counts_are_each_exchanges_sum_over_the_agents(held_per_agent):
    """messages_delayed of a node of workers (or a cluster): each exchange's held messages, summed over
    the agents that hold some; an exchange none holds is absent (its count is 0)."""
    agents = [FakeAgent(f"{NODE}#w{i}", [], [], [], {}) for i in range(len(held_per_agent))]
    for agent, rows in zip(agents, held_per_agent, strict=True):
        agent.delayed = [list(r) for r in rows]
    expected: dict[tuple[str, str], int] = {}
    for rows in held_per_agent:
        for vhost, x, n in rows:
            expected[vhost, x] = expected.get((vhost, x), 0) + n
    got = asyncio.run(GatheringAgent(NODE, agents).delayed_counts())
    assert {(v, x): n for v, x, n in got} == expected and len(got) == len(expected)
