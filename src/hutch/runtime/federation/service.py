"""Federation links: exchanges and queues whose policy names an upstream, each linked to that upstream by
a shovel-like worker (runtime/shovel/worker.py) with federation's hooks.

Owns: `FederationService` (which links should exist, from the `federation-upstream` /
`federation-upstream-set` parameters and the policies' `federation-upstream` / `federation-upstream-set`
keys; starting, stopping and re-binding them; a federated queue's demand; their status for
`GET /api/federation-links`), `ExchangeLink` and `QueueLink` (the hooks).

Rules:
- An exchange link declares on the upstream a durable queue `federation: X -> CLUSTER` (with the
  upstream's `expires` and `message-ttl`), binds it to the upstream exchange (`exchange`, default X's
  name, declared with X's type if it is missing) with every routing key (and arguments) bound to X
  downstream, and publishes what it receives into X with the message's routing key, after
  `core/federation.may_forward` (max-hops, loop detection) and with an `x-received-from` entry.
- When an exchange link is no longer wanted (its policy, upstream or exchange is gone) it deletes its
  upstream queue first (RabbitMQ's default `resource-cleanup-mode`); not when the links move to another
  node with the metadata leadership.
- A queue link consumes the upstream queue (`queue`, default the same name) only while the downstream
  queue has consumers and no ready messages, and stops at `prefetch-count` ready messages or when the last
  consumer goes; what it receives goes to the downstream queue.
- The set of links, their bindings and the queues' demand are reconciled every `RECONCILE_S` and at once
  when an upstream parameter changes: policies and bindings have no change hooks in the broker. A
  reconcile matches policies against the exchanges and queues of the vhosts that have both an upstream
  and a policy with a federation key, and skips every other vhost. Links run where the shovels run (the metadata
  leader) and act as the user who set the upstream.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hutch.amqp import spec
from hutch.core import federation as fed
from hutch.core.shovel import Endpoint, ShovelDef, shown_uri
from hutch.runtime.broker.parameters import Key, Parameter, ParameterStore
from hutch.runtime.ports import BrokerPort
from hutch.runtime.shovel.client import AmqpLink, LinkClosed
from hutch.runtime.shovel.pipe import open_local
from hutch.runtime.shovel.worker import LinkHooks, ShovelWorker

log = logging.getLogger("hutch.federation")
RECONCILE_S = 1.0
LinkKey = tuple[str, str, str, str]  # vhost, "exchange" | "queue", its name, upstream name


def _decode_headers(props: bytes) -> spec.BasicProperties:
    return spec.BasicProperties.decode(b"\0" * 12 + props, 12)


class ExchangeLink(LinkHooks):
    def __init__(self, exchange: str, exchange_type: str, upstream: fed.Upstream, local_cluster: str,
                 bindings: set[tuple[str, str]]) -> None:
        self.exchange = exchange
        self.exchange_type = exchange_type
        self.upstream = upstream
        self.local_cluster = local_cluster
        self.wanted = bindings  # (routing key, arguments as JSON) bound to the exchange downstream
        self.bound: set[tuple[str, str]] = set()
        self.queue = ""

    @property
    def upstream_exchange(self) -> str:
        return self.upstream.exchange or self.exchange

    async def setup_source(self, src: AmqpLink, queue: str) -> None:
        try:
            await src.call(spec.Exchange.Declare(exchange=self.upstream_exchange, passive=True),
                           spec.Exchange.DeclareOk)
        except LinkClosed as exc:
            if exc.code != 404:
                raise
            await src.call(spec.Channel.Open(), spec.Channel.OpenOk)
            await src.call(spec.Exchange.Declare(exchange=self.upstream_exchange, type=self.exchange_type,
                                                 durable=True), spec.Exchange.DeclareOk)
        self.queue = queue
        self.bound = set()
        await self.sync(src.call)

    async def sync(self, call: Callable[..., Any]) -> None:
        """Bind what is bound downstream and not yet upstream; unbind what no longer is."""
        for key, args in sorted(self.wanted - self.bound):
            if await call(spec.Queue.Bind(queue=self.queue, exchange=self.upstream_exchange, routing_key=key,
                                          arguments=json.loads(args)), spec.Queue.BindOk) is None:
                return  # not connected: the next session binds everything again
            self.bound.add((key, args))
        for key, args in sorted(self.bound - self.wanted):
            if await call(spec.Queue.Unbind(queue=self.queue, exchange=self.upstream_exchange, routing_key=key,
                                            arguments=json.loads(args)), spec.Queue.UnbindOk) is None:
                return
            self.bound.discard((key, args))

    def transform(self, props: bytes, exchange: str, redelivered: bool, src: AmqpLink) -> bytes | None:
        decoded = _decode_headers(props)
        if not fed.may_forward(decoded.headers, self.local_cluster, self.upstream.max_hops):
            return None
        cluster = src.server_properties.get("cluster_name", "")
        cluster = cluster.decode(errors="replace") if isinstance(cluster, bytes) else str(cluster)
        decoded.headers = fed.stamp(decoded.headers, self.upstream.uris[0], exchange, redelivered, cluster)
        return decoded.encode()


class QueueLink(LinkHooks):
    consume_at_start = False


@dataclass
class Link:
    key: LinkKey
    upstream: fed.Upstream
    policy: str
    worker: ShovelWorker
    hooks: ExchangeLink | QueueLink
    busy: bool = False  # a rebind or consume/cancel in flight


class FederationService:
    def __init__(self, node: BrokerPort, store: ParameterStore, runs_here: Callable[[], bool] = lambda: True) -> None:
        self.node = node
        self.store = store
        self.runs_here = runs_here
        self.links: dict[LinkKey, Link] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False

    @property
    def local_cluster(self) -> str:
        return self.node.config.cluster_name or self.node.config.node_name

    async def start(self) -> None:
        self._started = True
        self.store.watchers.append(self._changed)
        self._tick()

    async def stop(self) -> None:
        self._started = False
        if self._changed in self.store.watchers:
            self.store.watchers.remove(self._changed)
        if self._timer is not None:
            self._timer.cancel()
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.worker.stop() for link in links))
        for task in list(self._tasks):
            task.cancel()

    def placement_changed(self) -> None:
        if self._started:
            self.reconcile()

    def _changed(self, p: Parameter | None, key: Key) -> None:
        if key[0] in (fed.UPSTREAM, fed.UPSTREAM_SET) and self._started:
            self.reconcile()

    def _tick(self) -> None:
        self.reconcile()
        self._timer = asyncio.get_running_loop().call_later(RECONCILE_S, self._tick)

    # -- what should run ------------------------------------------------------------------------------
    def _wanted(self) -> dict[LinkKey, tuple[fed.Upstream, str, Any, str]]:
        """Every link that should exist: key -> (upstream, kind, the exchange or queue, policy name)."""
        node: Any = self.node
        wanted: dict[LinkKey, tuple[fed.Upstream, str, Any, str]] = {}
        for vhost_name, vhost in node.vhosts.items():
            upstreams: dict[str, fed.Upstream] = {}
            for p in self.store.list(fed.UPSTREAM, vhost_name):
                try:
                    upstreams[p.name] = fed.parse_upstream(p.name, p.value)
                except ValueError:
                    continue
            if not upstreams or not any(key in p.definition for p in node.policies.list(vhost_name)
                                        for key in fed.POLICY_KEYS):
                continue  # nothing federated here: no per-object policy matching
            sets = {}
            for p in self.store.list(fed.UPSTREAM_SET, vhost_name):
                try:
                    sets[p.name] = fed.parse_upstream_set(p.name, p.value)
                except ValueError:
                    continue
            for x in vhost.exchanges.values():
                policy, _ = node.policies.match_exchange(vhost_name, x.name)
                if policy is not None and x.name and not x.name.startswith("amq."):
                    for u in fed.upstreams_for(policy.definition, upstreams, sets):
                        wanted[(vhost_name, "exchange", x.name, u.name)] = (u, "exchange", x, policy.name)
            for q in vhost.queues.values():
                policy, _ = node.policies.match_queue(vhost_name, q.name, q.queue_type)
                if policy is not None:
                    for u in fed.upstreams_for(policy.definition, upstreams, sets):
                        wanted[(vhost_name, "queue", q.name, u.name)] = (u, "queue", q, policy.name)
        return wanted

    def reconcile(self) -> None:
        wanted = self._wanted() if self.runs_here() else {}
        for key in [k for k, link in self.links.items() if k not in wanted or wanted[k][0] != link.upstream]:
            # a link that is no longer wanted (policy, upstream or exchange gone) removes its upstream queue,
            # which would otherwise fill up forever; not when its upstream's definition changed (it starts
            # again on the same queue) nor when leadership moves (the new leader goes on with it)
            self._spawn(self._retire(self.links.pop(key), cleanup=self.runs_here() and key not in wanted))
        for key, (upstream, kind, obj, policy) in wanted.items():
            found = self.links.get(key)
            link = found if found is not None else self._launch(key, upstream, kind, obj, policy)
            self.links[key] = link
            if kind == "exchange":
                self._rebind(link, obj)
            else:
                self._demand(link, obj)

    def _launch(self, key: LinkKey, upstream: fed.Upstream, kind: str, obj: Any, policy: str) -> Link:
        vhost, _, name, _ = key
        hooks: ExchangeLink | QueueLink
        if kind == "exchange":
            hooks = ExchangeLink(name, obj.type, upstream, self.local_cluster, _bindings(obj))
            source = Endpoint(upstream.uris, queue=fed.exchange_queue_name(name, self.local_cluster),
                              queue_args=_queue_args(upstream))
            dest = Endpoint(("amqp://",), exchange=name)
        else:
            hooks = QueueLink()
            source = Endpoint(upstream.uris, queue=upstream.queue or name)
            dest = Endpoint(("amqp://",), queue=name)
        d = ShovelDef(f"federation link {kind} {name} <- {upstream.name}", source, dest, upstream.prefetch_count,
                      ack_mode=upstream.ack_mode, reconnect_delay_s=upstream.reconnect_delay_s or 1.0)
        setter = self.store.get(fed.UPSTREAM, vhost, upstream.name)
        user = (setter.user if setter is not None else "") or self.node.config.default_user
        worker = ShovelWorker(d, vhost, user, self.node.config.node_name, self._open_local, lambda w: None, hooks)
        worker.start()
        return Link(key, upstream, policy, worker, hooks)

    async def _open_local(self, user: str, vhost: str, name: str) -> AmqpLink:
        return await open_local(self.node, user, vhost, name)

    async def _retire(self, link: Link, cleanup: bool) -> None:
        hooks = link.hooks
        if cleanup and isinstance(hooks, ExchangeLink) and hooks.queue:
            try:
                await link.worker.source_call(spec.Queue.Delete(queue=hooks.queue), spec.Queue.DeleteOk)
            except LinkClosed as exc:
                log.info("federation link %s: upstream queue %r not deleted: %s", link.key, hooks.queue, exc)
        await link.worker.stop()

    def _rebind(self, link: Link, exchange: Any) -> None:
        hooks = link.hooks
        assert isinstance(hooks, ExchangeLink)
        hooks.wanted = _bindings(exchange)
        if hooks.wanted != hooks.bound and link.worker.state == "running" and not link.busy:
            self._guarded(link, hooks.sync(link.worker.source_call))

    def _demand(self, link: Link, queue: Any) -> None:
        """Pull while the local queue has consumers and nothing ready; stop at prefetch-count ready."""
        consumers, ready = queue.consumer_count, queue.message_count
        want = consumers > 0 and (ready == 0 or (link.worker.consuming and ready < max(1, link.upstream.prefetch_count)))
        if want != link.worker.consuming and link.worker.state == "running" and not link.busy:
            self._guarded(link, link.worker.set_consuming(want))

    def _guarded(self, link: Link, coro: Any) -> None:
        link.busy = True

        async def run() -> None:
            try:
                await coro
            except LinkClosed as exc:  # the worker sees its link fail and reconnects
                log.info("federation link %s: %s", link.key, exc)
            finally:
                link.busy = False

        self._spawn(run())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- status -------------------------------------------------------------------------------------
    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """RabbitMQ's federation-links fields."""
        out = []
        for (v, kind, name, upstream), link in sorted(self.links.items()):
            if vhost is not None and v != vhost:
                continue
            w = link.worker
            state = {"running": "running", "starting": "starting"}.get(w.state, "error")
            item: dict[str, Any] = {
                "node": self.node.config.node_name, "vhost": v, "type": kind, kind: name, "upstream": upstream,
                f"upstream_{kind}": (link.upstream.exchange or name) if kind == "exchange" else (link.upstream.queue or name),
                "id": f"{kind}:{v}:{name}:{upstream}", "status": state, "uri": shown_uri(link.upstream.uris[0]),
                "local_connection": f"Federation link (upstream: {upstream}, policy: {link.policy})",
                "timestamp": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.changed_at)),
                "messages_forwarded": w.forwarded}
            if state == "error":
                item["error"] = w.reason
            if kind == "queue":
                item["consuming"] = w.consuming
            out.append(item)
        return out


def _bindings(exchange: Any) -> set[tuple[str, str]]:
    return {(b.routing_key, json.dumps(dict(b.arguments or {}), sort_keys=True, default=str))
            for b in exchange.router.bindings()}


def _queue_args(u: fed.Upstream) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if u.expires_ms is not None:
        args["x-expires"] = u.expires_ms
    if u.message_ttl_ms is not None:
        args["x-message-ttl"] = u.message_ttl_ms
    return args


__all__ = ["RECONCILE_S", "ExchangeLink", "FederationService", "QueueLink"]
