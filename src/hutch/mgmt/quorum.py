"""Quorum queue operations over HTTP: what `hutch-queues` calls (hutch extensions; RabbitMQ does these
with rabbitmq-queues over its Erlang distribution).

Owns the service side of:
- `GET /api/queues/{vhost}/{name}/quorum-status`: one row per member (Raft role, voter or not, term, log
  indexes, how far the leader knows it has replicated to it), each asked of the member itself;
- `POST /api/queues/{vhost}/{name}/members` {"node": N} and `DELETE .../members/{node}` (quorum queues and
  replicated streams: the stream queue type's `change_member`);
- `POST /api/quorum-queues/grow` {"node", "strategy": "all"|"even", "vhost_pattern", "queue_pattern"},
  `POST /api/quorum-queues/shrink` {"node", "errors_only"}, `POST /api/quorum-queues/rebalance`
  {"vhost_pattern", "queue_pattern"}: per-queue reports;
- `serve(node)`: the two inter-node requests these need: `qq.mgmt.local` (a member's own view of a
  queue's Raft group) and `qq.mgmt.transfer` (at the leader: hand leadership to another member).

Rules:
- Administrator only. A node that is not clustered answers 400.
- Node names may be given in full (`n3@host`) or short (`n3`) when the short form names one member.
- A membership change needs a quorum: a majority of the queue's members (before and after the change)
  must be running, and a node to add must be running; otherwise 503 with the counts, before anything is
  tried. What the runtime refuses is 400 (a reason), a missing node or member 404, a change that did
  not commit in time 503.
- grow, shrink and rebalance go on past a failed queue and report every queue; they never run two
  changes of one queue at once (one queue after the other).
- Patterns are regular expressions searched in the name (Erlang's re:run, as rabbitmq-queues does).
"""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING, Any

from hutch.cluster import messages as cm
from hutch.core.patterns import PatternError, UserPattern, compile_pattern
from hutch.core.vhost import rs
from hutch.runtime.queue_types.quorum.queue import QuorumQueue
from hutch.runtime.queue_types.quorum.service import QuorumService
from hutch.runtime.workers.spec import node_of_worker

from .access import Principal, require_admin
from .cluster import cluster_service
from .errors import ApiError, bad_request, not_found, not_found_because

if TYPE_CHECKING:
    from hutch.runtime.broker.node import Node
    from hutch.runtime.clustering.service import ClusterService

PEER_TIMEOUT_S = 2.0
TRANSFER_WAIT_S = 5.0
POLL_S = 0.05
STRATEGIES = ("all", "even")


# -- lookups ----------------------------------------------------------------------------------------


def _cluster(node: Node) -> ClusterService:
    cluster = cluster_service(node)
    if cluster is None:
        raise bad_request("this node is not clustered: quorum queues need a cluster (it was started "
                          "with --no-cluster; see docs/clustering.md)")
    return cluster


def _quorum(cluster: ClusterService) -> QuorumService:
    """The node's quorum queue service: the cluster subsystem runtime/app.py registers for quorum queues."""
    for sub in cluster.subsystems:
        if isinstance(sub, QuorumService):
            return sub
    raise AssertionError("runtime/app.py registers a quorum service with every cluster service")


def _running(node: Node, name: str) -> bool:
    return name == node.name or _cluster(node).transport.connected(name)


def _node_name(node: Node, text: Any) -> str:
    """A member of the cluster named in full, or by its short name when that names one member."""
    if not isinstance(text, str) or not text:
        raise bad_request('expected {"node": "NODE"} (a node name, e.g. n3@host)')
    members = list(_cluster(node).machine.members)
    if text in members:
        return text
    if "@" not in text:
        found = [m for m in members if m.split("@", 1)[0] == text]
        if len(found) == 1:
            return found[0]
    raise not_found_because(f"node '{text}' is not a member of this cluster")


def _quorum_queue(node: Node, vhost: str, name: str) -> QuorumQueue:
    v = node.vhosts.get(vhost)
    if v is None:
        raise not_found()
    q = v.queues.get(name)
    if q is None:
        raise not_found()
    if not isinstance(q, QuorumQueue):
        raise bad_request(f"{rs('queue', name, vhost)} is a {q.queue_type} queue, not a quorum queue")
    return q


def _member_queue(node: Node, vhost: str, name: str) -> Any:
    """A queue with members: a quorum queue or a stream (whose own rules are its queue type's; read
    duck-typed, as mgmt imports no more runtime modules: tests/unit/test_layers.py)."""
    v = node.vhosts.get(vhost)
    q = None if v is None else v.queues.get(name)
    if q is not None and q.queue_type == "stream":
        return q
    return _quorum_queue(node, vhost, name)


def _pattern(body: dict[str, Any], key: str) -> UserPattern:
    text = body.get(key, ".*")
    if text is None:
        text = ".*"
    if not isinstance(text, str):
        raise bad_request(f"{key} must be a string (a regular expression)")
    try:
        return compile_pattern(text)  # RE2: linear-time matching on the event loop
    except PatternError as exc:
        raise bad_request(f"{key}: {exc}") from None


def _matching(node: Node, body: dict[str, Any], streams: bool = False) -> list[Any]:
    """The quorum queues (`streams`: and the replicated streams this node is a member of) whose vhost and
    name match the body's patterns, by vhost then name."""
    vhost_re, queue_re = _pattern(body, "vhost_pattern"), _pattern(body, "queue_pattern")
    out: list[Any] = []
    for vname in sorted(node.vhosts):
        if not vhost_re.search(vname):
            continue
        for qname, q in sorted(node.vhosts[vname].queues.items()):
            replicated_stream = streams and q.queue_type == "stream" and getattr(q, "replication", None) is not None
            if (isinstance(q, QuorumQueue) or replicated_stream) and queue_re.search(qname):
                out.append(q)
    return out


def _body(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad_request("expected a JSON object")
    return body


# -- what the members say -----------------------------------------------------------------------------


def local_view(node: Node, gid: int) -> dict[str, Any]:
    """This node's own view of a quorum queue's Raft group (names instead of raft ids)."""
    cluster = _cluster(node)
    svc = _quorum(cluster)
    q = svc.queues.get(int(gid))
    if q is None or q.replica is None or q.replica.group is None:
        return {"node": node.name, "member": False}
    st = q.replica.group.status()

    def name(raft_id: int) -> str:
        return cluster.name_of(raft_id) or f"raft id {raft_id}"

    out: dict[str, Any] = {
        "node": node.name, "member": True, "role": st["role"], "term": st["term"], "leader": svc.leader_name(q),
        "commit_index": st["commit"], "last_applied": st["applied"], "first_index": st["first_index"],
        "last_index": st["last_index"], "voters": [name(v) for v in st["voters"]],
    }
    if "progress" in st:
        out["match_index"] = {name(v): pr["match"] for v, pr in st["progress"].items()}
    return out


async def _view_of(node: Node, q: QuorumQueue, member: str) -> dict[str, Any] | None:
    """`member`'s view of `q`'s group; None when it cannot be asked."""
    if member == node.name:
        return local_view(node, q.gid)
    cluster = _cluster(node)
    if not cluster.transport.connected(member):
        return None
    try:
        view: dict[str, Any] = await cluster.call(member, cm.QuorumLocalView(q.gid), timeout=PEER_TIMEOUT_S)
        return view
    except Exception:  # noqa: BLE001 - a member that does not answer is shown as unreachable
        return None


async def _views(node: Node, q: QuorumQueue) -> dict[str, dict[str, Any] | None]:
    members = list(q.members)
    views = await asyncio.gather(*(_view_of(node, q, m) for m in members))
    return dict(zip(members, views, strict=True))


def _leader_view(views: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    leaders = [v for v in views.values() if v and v.get("role") == "leader"]
    return max(leaders, key=lambda v: v["term"]) if leaders else None


async def _leader_of(node: Node, q: QuorumQueue) -> str | None:
    """The queue's leader: this node knows it when it is a member; otherwise a member is asked."""
    lead = _quorum(_cluster(node)).leader_name(q)
    if lead is not None or node.name in q.members:
        return lead
    for m in q.members:
        view = await _view_of(node, q, m)
        if view and view.get("leader"):
            return str(view["leader"])
    return None


async def quorum_status(node: Node, p: Principal, vhost: str, name: str) -> list[dict[str, Any]]:
    """One row per member, rabbitmq-queues quorum_status's columns in hutch's names."""
    require_admin(p)
    _cluster(node)
    q = _quorum_queue(node, vhost, name)
    views = await _views(node, q)
    lead = _leader_view(views)
    rows = []
    for member, view in views.items():
        row: dict[str, Any] = {"node": node_of_worker(member), "online": _running(node, member)}
        if row["node"] != member:
            row["worker"] = member  # a member that is a worker of a node of workers (hutch's own column)
        if view is None:
            row["role"] = "unreachable"
        elif not view.get("member"):
            row["role"] = "not started"  # added to the metadata; its group is not open yet
        else:
            row.update({k: view[k] for k in ("role", "term", "commit_index", "last_applied", "first_index",
                                             "last_index")})
        if lead is not None:
            row["membership"] = "voter" if member in lead["voters"] else "joining"
            match = lead["last_index"] if member == lead["node"] else lead.get("match_index", {}).get(member)
            row["match_index"] = match
            row["caught_up"] = match is not None and match >= lead["commit_index"]
        rows.append(row)
    return rows


# -- membership -----------------------------------------------------------------------------------------


def _need_quorum(node: Node, q: Any, after: list[str]) -> None:  # Any: a quorum queue or a stream
    """503 unless a majority of the members before and after the change are running."""
    for members in (q.members, after):
        running = [m for m in members if _running(node, m)]
        need = len(members) // 2 + 1
        if len(running) < need:
            down = ", ".join(m for m in members if m not in running)
            raise ApiError(503, "service_unavailable",
                           f"cannot change the members of {rs('queue', q.name, q.vhost)}: {len(running)} of "
                           f"{len(members)} members running ({down} not); a membership change needs a quorum "
                           f"({need})")


def _runtime_error(exc: Exception, what: str) -> ApiError | None:
    """The API error for what the runtime (here or on the leader) raised; None: not ours to map."""
    from hutch.runtime.clustering.raft_group import GroupClosed, NotLeader, ProposalTimeout
    from hutch.runtime.clustering.transport import PeerUnavailable, RemoteError
    from hutch.runtime.errors import ClusterUnavailable
    kind = exc.remote_type if isinstance(exc, RemoteError) else type(exc).__name__
    text = str(exc).strip("'\"")
    if isinstance(exc, LookupError) or kind in ("LookupError", "KeyError"):
        return not_found_because(text.removeprefix("404 "))
    if isinstance(exc, ValueError) or kind == "ValueError":
        return bad_request(text)
    if isinstance(exc, (TimeoutError, ProposalTimeout, NotLeader, PeerUnavailable, GroupClosed, RemoteError,
                        ClusterUnavailable)):
        return ApiError(503, "service_unavailable", f"{what} did not complete: {text or type(exc).__name__}")
    return None


async def _change(node: Node, q: Any, member: str, add: bool) -> None:  # Any: a quorum queue or a stream
    cluster = _cluster(node)
    what = f"{'adding' if add else 'removing'} {member} {'to' if add else 'from'} {rs('queue', q.name, q.vhost)}"
    if add:
        if member in q.members:
            raise bad_request(f"node '{member}' is already a member of {rs('queue', q.name, q.vhost)}")
        if not _running(node, member):
            raise ApiError(503, "service_unavailable", f"node '{member}' is not running: a new member must be "
                                                       "running to catch up")
        _need_quorum(node, q, [*q.members, member])
    else:
        if member not in q.members:
            raise not_found_because(f"node '{member}' is not a member of {rs('queue', q.name, q.vhost)}")
        if len(q.members) == 1:
            raise bad_request(f"cannot remove the last member of {rs('queue', q.name, q.vhost)} (delete the "
                              "queue instead)")
        _need_quorum(node, q, [m for m in q.members if m != member])
    try:
        if q.queue_type == "stream":  # (runtime/queue_types/stream/queue_type.py: the stream's own rules)
            await node.queue_type_of(q).change_member(node.vhosts[q.vhost], q, member, add)  # type: ignore[attr-defined]  # the stream type's, not the port's
        else:
            svc = _quorum(cluster)
            await (svc.add_member(q, member) if add else svc.delete_member(q, member))
        if (member in q.members) != add:  # the leader made the change elsewhere: read it back here
            await cluster.barrier()
    except Exception as exc:
        error = _runtime_error(exc, what)
        if error is None:
            raise
        raise error from None


async def add_member(node: Node, p: Principal, vhost: str, name: str, body: Any) -> dict[str, Any]:
    require_admin(p)
    _cluster(node)
    q = _member_queue(node, vhost, name)
    member = _node_name(node, _body(body).get("node"))
    await _change(node, q, member, add=True)
    return {"vhost": vhost, "name": name, "members": list(q.members)}


async def delete_member(node: Node, p: Principal, vhost: str, name: str, member: str) -> None:
    require_admin(p)
    _cluster(node)
    q = _member_queue(node, vhost, name)
    await _change(node, q, _node_name(node, member), add=False)


async def _report(node: Node, q: Any, member: str, add: bool) -> dict[str, Any]:  # Any: as `_change`
    row: dict[str, Any] = {"vhost": q.vhost, "name": q.name}
    try:
        await _change(node, q, member, add)
        row["result"] = "ok"
    except ApiError as exc:
        row["result"] = "error"
        row["reason"] = exc.reason
    row["size"] = len(q.members)
    return row


async def grow(node: Node, p: Principal, body: Any) -> list[dict[str, Any]]:
    """Add `node` to every matching quorum queue (and replicated stream of this node) it is not a member
    of (`even`: only those with an even number of members), as rabbitmq-queues grow."""
    require_admin(p)
    _cluster(node)
    body = _body(body)
    member = _node_name(node, body.get("node"))
    strategy = body.get("strategy", "all")
    if strategy not in STRATEGIES:
        raise bad_request(f"strategy must be 'all' or 'even', not {strategy!r}")
    if not _running(node, member):
        raise ApiError(503, "service_unavailable", f"node '{member}' is not running")
    rows = []
    for q in _matching(node, body, streams=True):
        if member in q.members or (strategy == "even" and len(q.members) % 2):
            continue
        rows.append(await _report(node, q, member, add=True))
    return rows


async def shrink(node: Node, p: Principal, body: Any) -> list[dict[str, Any]]:
    """Remove `node` from every quorum queue (and replicated stream of this node) it is a member of
    (running or not), as rabbitmq-queues shrink; `errors_only`: report only the queues where that failed."""
    require_admin(p)
    _cluster(node)
    body = _body(body)
    member = _node_name(node, body.get("node"))
    rows = []
    for q in _matching(node, {}, streams=True):
        if member in q.members:
            rows.append(await _report(node, q, member, add=False))
    if body.get("errors_only") in (True, "true"):
        rows = [r for r in rows if r["result"] != "ok"]
    return rows


# -- leaders ----------------------------------------------------------------------------------------------


def plan_moves(leaders: dict[str, str], members: dict[str, list[str]], nodes: list[str]) -> list[tuple[str, str]]:
    """Leader moves that even out the leaders per node: (queue key, new leader), in order.

    `leaders`: queue key -> its leader; `members`: queue key -> its members; `nodes`: the running nodes.
    A queue moves from its leader to its running member that leads the fewest queues while the two
    counts differ by two or more; every move lowers the sum of squared counts, so this ends."""
    counts = dict.fromkeys(nodes, 0)
    for lead in leaders.values():
        if lead in counts:
            counts[lead] += 1
    planned = dict(leaders)
    moved: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for key in sorted(planned):
            lead = planned[key]
            if lead not in counts:
                continue
            candidates = [m for m in members[key] if m in counts and m != lead]
            if not candidates:
                continue
            best = min(candidates, key=lambda m: (counts[m], m))
            if counts[lead] - counts[best] >= 2:
                counts[lead] -= 1
                counts[best] += 1
                planned[key] = best
                moved[key] = best
                changed = True
    return [(key, to) for key, to in moved.items() if to != leaders[key]]


async def _transfer(node: Node, q: QuorumQueue, lead: str, to: str) -> str | None:
    """Ask the leader to hand over to `to` and wait for it; None when done, else the reason."""
    cluster = _cluster(node)
    try:
        if lead == node.name:
            _quorum(cluster).transfer_leader(q, to)
        else:
            await cluster.call(lead, cm.QuorumTransfer(q.gid, to), timeout=PEER_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - reported per queue
        return str(exc).strip("'\"") or type(exc).__name__
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TRANSFER_WAIT_S
    while loop.time() < deadline:
        now = await _leader_of(node, q)
        if now == to:
            return None
        await asyncio.sleep(POLL_S)
    return f"{to} did not take over within {TRANSFER_WAIT_S:g} s"


async def _leaders(node: Node, queues: list[QuorumQueue]) -> dict[str, str]:
    leaders = await asyncio.gather(*(_leader_of(node, q) for q in queues))
    return {f"{q.vhost}\x00{q.name}": lead for q, lead in zip(queues, leaders, strict=True) if lead}


async def rebalance(node: Node, p: Principal, body: Any) -> dict[str, Any]:
    """Move quorum queue leaders so every running node leads about as many as the others."""
    require_admin(p)
    cluster = _cluster(node)
    queues = _matching(node, _body(body))
    nodes = sorted(m for m in cluster.machine.members if _running(node, m))
    by_key = {f"{q.vhost}\x00{q.name}": q for q in queues}
    before = await _leaders(node, queues)
    moves = []
    for key, to in plan_moves(before, {k: list(q.members) for k, q in by_key.items()}, nodes):
        q = by_key[key]
        reason = await _transfer(node, q, before[key], to)
        move = {"vhost": q.vhost, "name": q.name, "from": before[key], "to": to,
                "result": "ok" if reason is None else "error"}
        if reason is not None:
            move["reason"] = reason
        moves.append(move)
    after = await _leaders(node, queues)

    def table(leaders: dict[str, str]) -> dict[str, int]:
        counts = dict.fromkeys(nodes, 0)
        for lead in leaders.values():
            counts[lead] = counts.get(lead, 0) + 1
        return counts

    hosted = {n: sum(n in q.members for q in queues) for n in nodes}
    counts_before, counts_after = table(before), table(after)
    return {
        "moves": moves,
        "nodes": [{"node": n, "queues": hosted.get(n, 0), "leaders_before": counts_before.get(n, 0),
                   "leaders_after": counts_after.get(n, 0)} for n in sorted(counts_after)],
        "target": math.ceil(len(queues) / len(nodes)) if nodes else 0,
    }


# -- the other nodes' side ------------------------------------------------------------------------------


def _transfer_here(node: Node, req: cm.QuorumTransfer) -> bool:
    cluster = _cluster(node)
    q = _quorum(cluster).queues.get(req.gid)
    if q is None:
        raise LookupError("no such quorum queue on this node")
    _quorum(cluster).transfer_leader(q, req.to)
    return True


def serve(node: Node) -> None:
    """Let the other nodes of a cluster ask this one about its quorum queue replicas (clustered only)."""
    cluster = cluster_service(node)
    if cluster is not None:
        cluster.register(cm.QuorumLocalView, lambda _peer, req: local_view(node, req.gid))
        cluster.register(cm.QuorumTransfer, lambda _peer, req: _transfer_here(node, req))


__all__ = ["add_member", "delete_member", "grow", "local_view", "plan_moves", "quorum_status", "rebalance",
           "serve", "shrink"]
