"""Another worker's management agent, asked over the worker link: the remote agent and its answerer.

Owns: `RemoteAgent`, a `ManagementAgentPort` (runtime/ports.py) whose every method sends one
`AgentQuery` request record (cluster/messages.py) to a peer and returns its plain answer; `serve_agent`,
which answers those requests with this process's own agent after checking them against `METHODS` (the
method names a peer may ask for and the shape of their arguments); and `node_agent`, the agent of a node
of worker processes as worker 0's management listener sees it (`WorkersAgent`: worker 0's own agent and
a remote agent per other worker, gathered and named as the node).

Rules:
- A peer that is not connected (a worker restarting) or does not answer within `timeout_s` (a queue's
  details: `PREPARE_TIMEOUT_S`, as a client's passive queue.declare waits for its home) is left out
  of the answer: its methods answer as an agent holding nothing (an empty list, no channel, "absent",
  False, 0). The management API never fails because a worker is down.
- A request naming a method not in `METHODS`, or with arguments of the wrong shape, is refused with
  `MalformedMessage` (the transport's error reply); nothing else of the agent can be reached.
- Queues: every worker holds every queue (its own, and stand-ins for the others' whose figures their
  homes push every second), so queue listings and deletes are worker 0's (a queue is listed once, also
  while its home worker restarts, shown `down`); a purge is gathered (the home purges and answers the
  count, a stand-in answers 0 and touches nothing); a queue's details (GET /api/queues/{vhost}/
  {name}, a listing's page) are its home's answer, so they are its figures now; everything else (connections,
  channels, consumers, counts, the statistics samples but their queue rows, closing connections) is
  gathered from every worker.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hutch.cluster import messages as cm

from .clustering.transport import PeerUnavailable, RemoteError
from .gather import GatheringAgent, in_order, merge_samples
from .queue_types.remote import PREPARE_TIMEOUT_S

if TYPE_CHECKING:
    from .clustering.service import ClusterService
    from .ports import ManagementAgentPort

log = logging.getLogger("hutch.agent")


def _text(v: Any) -> bool:
    return type(v) is str


def _text_or_none(v: Any) -> bool:
    return v is None or type(v) is str


def _flag(v: Any) -> bool:
    return type(v) is bool


def _key(v: Any) -> bool:
    return type(v) is list and len(v) == 2 and all(type(x) is str for x in v)


def _key_or_none(v: Any) -> bool:
    return v is None or _key(v)


MAX_KEYS = 10_000  # a page of queue details; the management API asks at most a page at a time


def _keys(v: Any) -> bool:
    return type(v) is list and len(v) <= MAX_KEYS and all(_key(k) for k in v)


def _texts_or_none(v: Any) -> bool:
    return v is None or (type(v) is list and len(v) <= MAX_KEYS and all(type(x) is str for x in v))


METHODS: dict[str, tuple[Callable[[Any], bool], ...]] = {
    "counts": (),
    "connections": (),
    "channels": (_text_or_none,),
    "channel": (_text,),
    "consumers": (_key_or_none,),
    "queues": (_texts_or_none,),
    "queue_details": (_keys,),
    "samples": (),
    "metric_samples": (),
    "process_figures": (),
    "delayed_counts": (),
    "purge_queue": (_text, _text),
    "delete_queue": (_text, _text, _flag, _flag),
    "close_connection": (_text, _text),
    "close_user_connections": (_text, _text),
    "stream_connections": (),
    "stream_groups": (_text,),
    "stream_tracking": (_text, _text),
    "close_stream_connection": (_text, _text, _text),
}
"""The agent methods a peer may call, with a check of each positional argument (plain msgpack values)."""


def _plain_args(method: str, args: list[Any]) -> list[Any]:
    """`args` as the agent's method takes them ((vhost, name) keys as tuples), after the checks."""
    checks = METHODS.get(method)
    if checks is None:
        raise cm.MalformedMessage(f"AgentQuery: no agent method {method!r}")
    if len(args) != len(checks) or not all(check(a) for check, a in zip(checks, args, strict=True)):
        raise cm.MalformedMessage(f"AgentQuery: bad arguments for {method}")
    if method == "consumers" and args[0] is not None:
        return [tuple(args[0])]
    if method == "queue_details":
        return [[tuple(k) for k in args[0]]]
    return args


def serve_agent(cluster: ClusterService, agent: ManagementAgentPort) -> None:
    """Answer the peers' `AgentQuery` requests with `agent` (this process's own)."""

    async def answer(_peer: str, req: cm.AgentQuery) -> Any:  # Any: the agent's plain answer, by method
        args = _plain_args(req.method, req.args)
        return await getattr(agent, req.method)(*args)

    cluster.register(cm.AgentQuery, answer)


def empty_samples() -> dict[str, Any]:
    """The statistics samples of an agent holding nothing (a new object each time: callers may extend it)."""
    return {"queues": [], "channels": [], "connections": [], "closed": [], "churn": {}}


def empty_metric_samples() -> dict[str, Any]:
    """The Prometheus samples of an agent holding nothing."""
    return {"connections": [], "channels": [], "closed": {}, "churn": {}, "streams": [], "stream_protocol": []}


class RemoteAgent:
    """The management agent of worker `peer`, asked over the worker link (see the module's rules)."""

    def __init__(self, cluster: ClusterService, peer: str, timeout_s: float = 2.0) -> None:
        self._cluster = cluster
        self._peer = peer
        self._timeout_s = timeout_s

    @property
    def name(self) -> str:
        return self._peer

    async def _ask(self, method: str, args: list[Any], empty: Any,
                   timeout_s: float | None = None) -> Any:  # Any: the answer, by method
        if not self._cluster.transport.connected(self._peer):
            return empty
        try:
            return await self._cluster.call(self._peer, cm.AgentQuery(method, args),
                                            timeout=self._timeout_s if timeout_s is None else timeout_s)
        except (PeerUnavailable, TimeoutError, RemoteError, ConnectionError, cm.MessageError) as exc:
            log.info("management: worker %s left out of a %s answer: %s", self._peer, method, exc)
            return empty

    async def counts(self) -> dict[str, int]:
        answer: dict[str, int] = await self._ask("counts", [], {})
        return answer

    async def connections(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._ask("connections", [], [])
        return answer

    async def channels(self, connection: str | None = None) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._ask("channels", [connection], [])
        return answer

    async def channel(self, name: str) -> dict[str, Any] | None:
        answer: dict[str, Any] | None = await self._ask("channel", [name], None)
        return answer

    async def consumers(self, queue: tuple[str, str] | None = None) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._ask("consumers", [None if queue is None else list(queue)], [])
        return answer

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._ask("queues", [vhosts], [])
        return answer

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        # a home worker's figures are waited for as long as a client's passive queue.declare waits for them
        # (a slow worker, e.g. on a loaded machine, is not a down one): left out, worker 0's stand-in would
        # answer with the counts last pushed (up to STATS_INTERVAL_S old), not the queue's now
        answer: list[dict[str, Any]] = await self._ask("queue_details", [[list(k) for k in keys]], [],
                                                       max(self._timeout_s, PREPARE_TIMEOUT_S))
        return answer

    async def samples(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._ask("samples", [], empty_samples())
        return answer

    async def metric_samples(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._ask("metric_samples", [], empty_metric_samples())
        return answer

    async def process_figures(self) -> dict[str, int]:
        answer: dict[str, int] = await self._ask("process_figures", [], {})
        return answer

    async def delayed_counts(self) -> list[list[Any]]:
        answer: list[list[Any]] = await self._ask("delayed_counts", [], [])
        return answer

    async def purge_queue(self, vhost: str, name: str) -> int | None:
        answer: int | None = await self._ask("purge_queue", [vhost, name], None)
        return answer

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        answer: str = await self._ask("delete_queue", [vhost, name, if_unused, if_empty], "absent")
        return answer

    async def close_connection(self, name: str, reason: str) -> bool:
        answer: bool = await self._ask("close_connection", [name, reason], False)
        return answer

    async def close_user_connections(self, user: str, reason: str) -> int:
        answer: int = await self._ask("close_user_connections", [user, reason], 0)
        return answer

    async def stream_connections(self) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._ask("stream_connections", [], [])
        return answer

    async def stream_groups(self, vhost: str) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = await self._ask("stream_groups", [vhost], [])
        return answer

    async def stream_tracking(self, vhost: str, stream: str) -> list[list[Any]] | None:
        answer: list[list[Any]] | None = await self._ask("stream_tracking", [vhost, stream], None)
        return answer

    async def close_stream_connection(self, vhost: str, name: str, reason: str) -> bool:
        answer: bool = await self._ask("close_stream_connection", [vhost, name, reason], False)
        return answer


class WorkersAgent(GatheringAgent):
    """A node of worker processes as one agent: gathered from every worker, but queues from the first
    (worker 0's own agent), which holds every worker's queues (see the module's rules)."""

    async def queues(self, vhosts: list[str] | None = None) -> list[dict[str, Any]]:
        return await self.agents[0].queues(vhosts)

    async def queue_details(self, keys: list[tuple[str, str]]) -> list[dict[str, Any]]:
        # Each queue as its home answers it (its figures now, not as last pushed to worker 0's stand-in):
        # every worker is asked, and an answer naming the worker that gave it is the home's. A queue whose
        # home did not answer (restarting) is worker 0's stand-in, shown `down`. A stand-in's `node` names
        # its home worker: renamed to the node, as clients see it, and the home worker's index kept in
        # `worker` (hutch's own field: where the queue's process is).
        workers = {a.name: i for i, a in enumerate(self.agents)}
        answers = await asyncio.gather(*(a.queue_details(keys) for a in self.agents))
        homes = [[q for q in answer if q.get("node") == agent.name] for agent, answer in zip(self.agents, answers,
                                                                                              strict=True)]
        for answer in answers:
            for q in answer:
                if q.get("node") in workers:
                    q["worker"] = workers[q["node"]]
        # a quorum queue is in every worker (each answers as its home): first the answer of one that knows
        # its leader (a member; in a multi-node cluster a node's member may be any of its workers)
        led = [[q for q in answer if q.get("type") == "quorum" and q.get("leader")] for answer in answers]
        return in_order([*led, *homes, answers[0]], keys, frozenset(workers), self.name)

    async def samples(self) -> dict[str, Any]:
        answers = await asyncio.gather(*(a.samples() for a in self.agents))
        return {**merge_samples(answers), "queues": answers[0]["queues"]}

    # purge_queue: gathered (GatheringAgent's): the home worker purges its queue and answers the count; the
    # other workers' stand-ins answer 0 and touch nothing. Worker 0 alone would purge only its own queues
    # (a stand-in's purge returns what a basic.purge had the home do, and nothing asked it).

    async def delete_queue(self, vhost: str, name: str, if_unused: bool, if_empty: bool) -> str:
        return await self.agents[0].delete_queue(vhost, name, if_unused, if_empty)


def node_agent(node_name: str, own: ManagementAgentPort, cluster: ClusterService,
               peers: list[str]) -> WorkersAgent:
    """Worker 0's agent for the node `node_name`: its own agent and a remote agent per other worker."""
    return WorkersAgent(node_name, [own, *(RemoteAgent(cluster, p) for p in peers)])


__all__ = ["METHODS", "RemoteAgent", "WorkersAgent", "empty_metric_samples", "empty_samples", "node_agent",
           "serve_agent"]
