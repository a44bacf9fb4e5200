"""One node's management view out of several agents' answers: the gatherer.

Owns: `GatheringAgent`, a `ManagementAgentPort` (runtime/ports.py) that asks every agent it holds
(one per worker process of a node, or two nodes' worth in a test) and merges their answers into one
node's, and the pure merge functions it uses (`merge_counts`, `merge_lists`, `renamed`), which the
cluster-wide listings use the same way. RabbitMQ's management plug-in gathers each node's agent so.

Rules (the merge):
- counts are summed key by key; lists are concatenated in the agents' order; a single object (one
  channel) is the first agent's that has it; a command goes to every agent and its results add up
  (a connection is closed where it lives, and the others answer that it is not theirs); objects asked
  for by name (queue details) come back in the order asked.
- the node name is one: every `node` field (and `channel_details.node`) that names one of the agents
  names the gatherer instead. A field naming another node (a queue homed on another cluster member)
  is left as it is.
- pure apart from `GatheringAgent`'s awaits; merging N agents' answers equals the answer of one
  agent holding everything (tests/unit/test_gather.py checks it with Hypothesis).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ports import ManagementAgentPort


def merge_counts(answers: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Counts summed key by key (a key one agent lacks counts 0 there); keys in first-seen order."""
    out: dict[str, int] = {}
    for answer in answers:
        for key, value in answer.items():
            out[key] = out.get(key, 0) + value
    return out


def renamed(obj: dict[str, Any], names: frozenset[str], name: str) -> dict[str, Any]:
    """`obj` with its `node` and `channel_details.node` fields that are in `names` set to `name` (in
    place: the key order, which the API's JSON keeps, is unchanged). Returns `obj`."""
    if obj.get("node") in names:
        obj["node"] = name
    details = obj.get("channel_details")
    if isinstance(details, dict) and details.get("node") in names:
        details["node"] = name
    for nested in ("consumer_details",):
        for item in obj.get(nested) or ():
            renamed(item, names, name)
    return obj


def merge_lists(answers: Iterable[Sequence[dict[str, Any]]], names: frozenset[str], name: str
                ) -> list[dict[str, Any]]:
    """The agents' lists concatenated, in their order, each object named for the one node."""
    return [renamed(obj, names, name) for answer in answers for obj in answer]


def in_order(answers: Iterable[Sequence[dict[str, Any]]], keys: Sequence[tuple[str, str]], names: frozenset[str],
             name: str) -> list[dict[str, Any]]:
    """The objects the agents answered for `keys` ((vhost, name) pairs), in the order of `keys`, each once
    (the first agent's, in the agents' order, when two hold one), named for the one node."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for answer in answers:
        for obj in answer:
            found.setdefault((obj["vhost"], obj["name"]), obj)
    return [renamed(found[key], names, name) for key in keys if key in found]


def merge_samples(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The statistics samples of several agents as one node's: lists concatenated, the closed channels'
    counters summed position by position, churn summed by name."""
    width = max((len(a["closed"]) for a in answers), default=0)
    # (an agent none of whose channels closed yet answers an empty row)
    closed = [sum(a["closed"][i] for a in answers if i < len(a["closed"])) for i in range(width)]
    return {"queues": [row for a in answers for row in a["queues"]],
            "channels": [row for a in answers for row in a["channels"]],
            "connections": [row for a in answers for row in a["connections"]],
            "closed": closed, "churn": merge_counts(a["churn"] for a in answers)}


def merge_metric_samples(answers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The Prometheus samples of several agents as one node's: lists concatenated, the closed channels'
    totals and the churn summed by name, a stream held by several (its members: every worker of a node of
    workers) once, with the most segment files and the greatest lag any of them has, and the stream
    protocol's counters summed (an agent without a stream listener answers none)."""
    streams: dict[tuple[str, str], list[Any]] = {}
    for a in answers:
        for vhost, name, segments, lag in a["streams"]:
            row = streams.setdefault((vhost, name), [vhost, name, segments, lag])
            row[2], row[3] = max(row[2], segments), max(row[3], lag)
    counted = [a["stream_protocol"] for a in answers if a["stream_protocol"]]
    return {"connections": [row for a in answers for row in a["connections"]],
            "channels": [row for a in answers for row in a["channels"]],
            "closed": merge_counts(a["closed"] for a in answers), "churn": merge_counts(a["churn"] for a in answers),
            "streams": list(streams.values()),
            "stream_protocol": [sum(column) for column in zip(*counted, strict=True)] if counted else []}


class GatheringAgent:
    """A node's agent made of several: asks them all at once and merges their answers."""

    def __init__(self, name: str, agents: Sequence[ManagementAgentPort]) -> None:
        assert agents, "a gatherer needs at least one agent"
        self._name = name
        self.agents = list(agents)

    @property
    def name(self) -> str:
        return self._name

    def _names(self) -> frozenset[str]:
        return frozenset(a.name for a in self.agents)

    async def counts(self) -> dict[str, int]:
        return merge_counts(await asyncio.gather(*(a.counts() for a in self.agents)))

    async def connections(self) -> list[dict[str, Any]]:
        answers = await asyncio.gather(*(a.connections() for a in self.agents))
        return merge_lists(answers, self._names(), self._name)

    async def channels(self, connection: str | None = None) -> list[dict[str, Any]]:
        answers = await asyncio.gather(*(a.channels(connection) for a in self.agents))
        return merge_lists(answers, self._names(), self._name)

    async def channel(self, name: str) -> dict[str, Any] | None:
        for found in await asyncio.gather(*(a.channel(name) for a in self.agents)):
            if found is not None:
                return renamed(found, self._names(), self._name)
        return None

    async def consumers(self, queue: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        answers = await asyncio.gather(*(a.consumers(queue) for a in self.agents))
        return merge_lists(answers, self._names(), self._name)

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        answers = await asyncio.gather(*(a.queues(vhosts) for a in self.agents))
        return [q for answer in answers for q in answer]

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        answers = await asyncio.gather(*(a.queue_details(keys) for a in self.agents))
        return in_order(answers, keys, self._names(), self._name)

    async def samples(self) -> dict[str, Any]:
        return merge_samples(await asyncio.gather(*(a.samples() for a in self.agents)))

    async def metric_samples(self) -> dict[str, Any]:
        return merge_metric_samples(await asyncio.gather(*(a.metric_samples() for a in self.agents)))

    async def process_figures(self) -> dict[str, int]:
        return merge_counts(await asyncio.gather(*(a.process_figures() for a in self.agents)))

    async def delayed_counts(self) -> list[list[Any]]:
        total: dict[tuple[str, str], int] = {}
        for answer in await asyncio.gather(*(a.delayed_counts() for a in self.agents)):
            for vhost, exchange, n in answer:
                total[vhost, exchange] = total.get((vhost, exchange), 0) + n
        return [[vhost, exchange, n] for (vhost, exchange), n in total.items()]

    async def purge_queue(self, vhost: str, name: str) -> int | None:
        found = [n for n in await asyncio.gather(*(a.purge_queue(vhost, name) for a in self.agents)) if n is not None]
        return sum(found) if found else None

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        for outcome in await asyncio.gather(*(a.delete_queue(vhost, name, if_unused, if_empty) for a in self.agents)):
            if outcome != "absent":
                return outcome
        return "absent"

    async def close_connection(self, name: str, reason: str) -> bool:
        return any(await asyncio.gather(*(a.close_connection(name, reason) for a in self.agents)))

    async def close_user_connections(self, user: str, reason: str) -> int:
        return sum(await asyncio.gather(*(a.close_user_connections(user, reason) for a in self.agents)))

    async def stream_connections(self) -> list[dict[str, Any]]:
        answers = await asyncio.gather(*(a.stream_connections() for a in self.agents))
        return merge_lists(answers, self._names(), self._name)

    async def stream_groups(self, vhost: str) -> list[dict[str, Any]]:
        # a group lives on one worker (its stream's writer, stream_session/sac_router.py): listed once
        answers = await asyncio.gather(*(a.stream_groups(vhost) for a in self.agents))
        return sorted((row for answer in answers for row in answer), key=lambda row: (row["stream"], row["reference"]))

    async def stream_tracking(self, vhost: str, stream: str) -> list[list[Any]] | None:
        # a stream's tracking is the same in every copy: the first that has one answers (its home, in a
        # node of workers; with a replica per worker, the first worker)
        answers = await asyncio.gather(*(a.stream_tracking(vhost, stream) for a in self.agents))
        return next((answer for answer in answers if answer is not None), None)

    async def close_stream_connection(self, vhost: str, name: str, reason: str) -> bool:
        return any(await asyncio.gather(*(a.close_stream_connection(vhost, name, reason) for a in self.agents)))


__all__ = ["GatheringAgent", "in_order", "merge_counts", "merge_lists", "merge_metric_samples", "merge_samples",
           "renamed"]
