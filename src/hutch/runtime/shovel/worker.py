"""One running dynamic shovel: two links, and messages moved from one to the other.

Owns: `ShovelWorker` (connect both sides, declare what RabbitMQ's shovel declares, consume with the
prefetch, publish each delivery to the destination, settle it at the source as the ack mode says,
reconnect after `reconnect-delay`, stop when `src-delete-after` is reached) and its status (`state`:
starting, running, terminated with `reason`; counters for metrics).

Rules:
- `on-confirm`: a source delivery is acked only when the destination confirmed its publish (a nack
  requeues it at the source), so a crash of either side loses nothing (messages may be repeated).
  `on-publish`: acked once written to the destination. `no-ack`: consumed without acks.
- Bounded: at most `src-prefetch-count` deliveries are unsettled (for no-ack, the destination's write
  buffer stops the source's reads); a delivery past the `src-delete-after` count is requeued.
- Per delivery, no task or coroutine: deliveries and confirms are callbacks of the links' frame loops.
- Local ends (`amqp://` without a host) are in-process connections acting as the parameter's user.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from hutch.amqp import spec
from hutch.amqp.table import TypedInt
from hutch.amqp.uri import UriError
from hutch.core.shovel import (
    Endpoint,
    ShovelDef,
    apply_publish_properties,
    delete_after_reached,
    endpoint_uri,
    forward_headers,
    local_vhost,
    x_death_queue,
)
from hutch.runtime.shovel.client import AmqpLink, LinkClosed, open_remote

log = logging.getLogger("hutch.shovel")

LocalOpener = Callable[[str, str, str], Awaitable[AmqpLink]]  # (user, vhost, connection name) -> link


class LinkHooks:
    """What a federation link adds to a shovel (runtime/federation/): the defaults are a plain shovel's."""

    consume_at_start = True

    async def setup_source(self, src: AmqpLink, queue: str) -> None:
        """After the source queue is declared (a federation exchange link binds it upstream)."""

    def transform(self, props: bytes, exchange: str, redelivered: bool, src: AmqpLink) -> bytes | None:
        """The properties to publish with, or None to drop the message (it is acked at the source)."""
        return props


class ShovelWorker:
    """A shovel's life: `start()` runs it as a task until `stop()` or until it has moved what
    `src-delete-after` asks (then `on_done` is called, and the service clears its parameter)."""

    def __init__(self, d: ShovelDef, vhost: str, user: str, node_name: str, open_local: LocalOpener,
                 on_done: Callable[[ShovelWorker], None], hooks: LinkHooks | None = None) -> None:
        self.d = d
        self.hooks = hooks or LinkHooks()
        self.consuming = False
        self._queue = ""
        self.vhost = vhost
        self.user = user
        self.node_name = node_name
        self.open_local = open_local
        self.on_done = on_done
        self.state = "starting"
        self.reason = ""
        self.changed_at = time.time()
        self.forwarded = 0  # messages published to the destination (all runs)
        self.acked = 0  # deliveries settled at the source (this definition's total: src-delete-after counts these)
        self.initial_length: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._src: AmqpLink | None = None
        self._dest: AmqpLink | None = None
        self._unconfirmed: dict[int, int] = {}  # dest publish seq -> source delivery tag (on-confirm)
        self._taken = 0  # deliveries taken (published) in total: stop taking at the delete-after count
        self._ack_upto = 0  # on-publish: the highest source tag to ack at the end of this turn
        self._ack_scheduled = False
        self._finished: asyncio.Future[None] | None = None

    # -- life -------------------------------------------------------------------------------------
    def start(self) -> None:
        assert self._task is None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"shovel {self.vhost}/{self.d.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await self._close_links()

    def _set(self, state: str, reason: str = "") -> None:
        self.state, self.reason, self.changed_at = state, reason, time.time()

    async def _run(self) -> None:
        while True:
            self._set("starting")
            try:
                done = await self._session()
            except (LinkClosed, UriError, OSError) as exc:
                done = False
                self._set("terminated", str(exc))
                log.warning("shovel '%s' in vhost '%s': %s", self.d.name, self.vhost, exc)
            except Exception as exc:  # noqa: BLE001 - a bug must not leave a shovel silently dead: report, retry
                done = False
                self._set("terminated", f"internal error: {exc!r}")
                log.exception("shovel '%s' in vhost '%s' failed", self.d.name, self.vhost)
            await self._close_links()
            if done:
                self._set("terminated", "completed")
                self.on_done(self)
                return
            if self.d.reconnect_delay_s <= 0:
                return  # RabbitMQ: a reconnect-delay of 0 means the shovel is not restarted
            await asyncio.sleep(self.d.reconnect_delay_s)

    async def _close_links(self) -> None:
        src, dest, self._src, self._dest = self._src, self._dest, None, None
        for link in (src, dest):
            if link is not None:
                link.on_lost = None
                await link.close()

    # -- one connected session --------------------------------------------------------------------
    async def _connect(self, ep: Endpoint, side: str) -> AmqpLink:
        name = f"Shovel {self.d.name}"
        problems = []
        for uri in ep.uris:
            try:
                if ep.local:
                    return await self.open_local(self.user, local_vhost(uri, self.vhost), name)
                return await open_remote(endpoint_uri(uri), name)
            except (LinkClosed, UriError) as exc:
                problems.append(str(exc))
        raise LinkClosed(f"{side}: " + "; ".join(problems))

    async def _session(self) -> bool:
        """Connect, set up and move until a link fails (raises) or the shovel is done (True)."""
        d = self.d
        self._unconfirmed.clear()
        self.consuming = False
        self._taken = self.acked  # what the last session took but did not settle went back to the source
        self._src = src = await self._connect(d.source, "source")
        self._dest = dest = await self._connect(d.dest, "destination")
        queue = await self._setup_source(src)
        if d.dest.queue is not None:
            await _declare(dest, d.dest.queue, d.dest.queue_args)
        confirming = d.ack_mode == "on-confirm"
        if confirming:
            await dest.call(spec.Confirm.Select(), spec.Confirm.SelectOk)
            dest.on_confirm = self._on_confirm
        self._finished = asyncio.get_running_loop().create_future()
        if delete_after_reached(d, self.acked, self.initial_length):
            return True
        src.on_delivery = self._on_delivery
        dest.on_writable = src.resume_reading
        await self.hooks.setup_source(src, queue)
        self._queue = queue
        if self.source_mode != "no-ack":
            await src.call(spec.Basic.Qos(prefetch_count=d.prefetch_count), spec.Basic.QosOk)
        if self.hooks.consume_at_start:
            await self.set_consuming(True)
        self._set("running")
        log.info("shovel '%s' in vhost '%s' running", d.name, self.vhost)
        waits: set[asyncio.Future[Any]] = {src.closed, dest.closed, self._finished}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if self._finished.done():
            return True
        closed = src.closed if src.closed.done() else dest.closed
        which = "source" if closed is src.closed else "destination"
        raise LinkClosed(f"{which}: {closed.result()}")

    @property
    def source_mode(self) -> str:
        """How the source is consumed: the ack mode, except that `no-ack` with a `src-delete-after`
        count acks each message once published (an auto-acked delivery past the count could not be
        handed back, and would be lost)."""
        d = self.d
        return "on-publish" if d.ack_mode == "no-ack" and d.delete_after != "never" else d.ack_mode

    async def set_consuming(self, on: bool) -> None:
        """Consume the source queue, or cancel (a federated queue pulls only while it is empty and has
        consumers). Deliveries already sent before a cancel are still moved and settled."""
        src = self._src
        if src is None or on == self.consuming or self.state not in ("starting", "running"):
            return
        self.consuming = on
        if on:
            await src.call(spec.Basic.Consume(queue=self._queue, consumer_tag="link", no_ack=self.source_mode == "no-ack",
                                              exclusive=False), spec.Basic.ConsumeOk)
        else:
            await src.call(spec.Basic.Cancel(consumer_tag="link"), spec.Basic.CancelOk)

    async def source_call(self, method: spec.Method, *replies: type) -> Any:
        """An RPC on the running source link (a federation link's bindings); None when not connected."""
        src = self._src
        if src is None or self.state != "running":
            return None
        return await src.call(method, *replies)

    async def _setup_source(self, src: AmqpLink) -> str:
        d = self.d
        if d.source.queue is not None:
            ok = await _declare(src, d.source.queue, d.source.queue_args)
            if self.initial_length is None and d.delete_after == "queue-length":
                self.initial_length = ok.message_count
            return d.source.queue
        ok = await src.call(spec.Queue.Declare(queue="", exclusive=True, auto_delete=True),
                            spec.Queue.DeclareOk)
        await src.call(spec.Queue.Bind(queue=ok.queue, exchange=d.source.exchange or "",
                                       routing_key=d.source.exchange_key or ""), spec.Queue.BindOk)
        return str(ok.queue)

    # -- moving (callbacks of the links' frame loops) ------------------------------------------------
    def _limit(self) -> int | None:
        d = self.d
        if d.delete_after == "never":
            return None
        return self.initial_length if d.delete_after == "queue-length" else int(d.delete_after)

    def _on_delivery(self, tag: int, redelivered: bool, exchange: str, key: str, props: bytes, body: bytes) -> None:
        src, dest, d = self._src, self._dest, self.d
        if src is None or dest is None:
            return
        limit = self._limit()
        if limit is not None and self._taken >= limit:
            if self.source_mode != "no-ack":
                src.send(spec.Basic.Reject(delivery_tag=tag, requeue=True))
            return
        if type(self.hooks) is not LinkHooks:
            shaped = self.hooks.transform(props, exchange, redelivered, src)
            if shaped is None:  # not forwarded (a federation link's max-hops or loop rule)
                if self.source_mode != "no-ack":
                    src.ack(tag)
                return
            props = shaped
        self._taken += 1
        if d.redrive:  # back to the queue it died in (or to the back of its dead-letter queue)
            out_exchange, out_key = "", self._died_in(props) or d.source.queue or ""
        elif d.dest.queue is not None:
            out_exchange, out_key = "", d.dest.queue
        elif d.dest.exchange is not None:
            out_exchange, out_key = d.dest.exchange, d.dest.exchange_key if d.dest.exchange_key is not None else key
        else:
            out_exchange, out_key = exchange, key
        seq = dest.publish(out_exchange, out_key, self._props(props), body)
        self.forwarded += 1
        if d.ack_mode == "on-confirm":
            self._unconfirmed[seq] = tag
        elif self.source_mode == "on-publish":
            self._ack_upto = tag
            if not self._ack_scheduled:
                self._ack_scheduled = True
                asyncio.get_running_loop().call_soon(self._ack_published)
        else:
            self._settled(1)
        if dest.write_paused:
            src.pause_reading()

    @staticmethod
    def _died_in(raw: bytes) -> str | None:
        return x_death_queue(spec.BasicProperties.decode(b"\0" * 12 + raw, 12).headers)

    def _props(self, raw: bytes) -> bytes:
        d = self.d
        if not (d.add_forward_headers or d.add_timestamp_header or d.publish_properties):
            return raw
        props = spec.BasicProperties.decode(b"\0" * 12 + raw, 12)
        headers = dict(props.headers or {})
        if d.add_forward_headers:
            headers["x-shovelled"] = [*headers.get("x-shovelled", []),
                                      forward_headers(d, self.vhost, self.node_name)]
        if d.add_timestamp_header:
            headers["x-shovelled-timestamp"] = TypedInt(int(time.time()), "l")  # a long, as RabbitMQ writes it
        if headers:
            props.headers = headers
        apply_publish_properties(props, d.publish_properties)
        return props.encode()

    def _ack_published(self) -> None:
        self._ack_scheduled = False
        src = self._src
        if src is not None and self._ack_upto:
            src.ack(self._ack_upto, multiple=True)
            self._settled(self._taken - self.acked)

    def _on_confirm(self, seq: int, multiple: bool, ack: bool) -> None:
        src = self._src
        if src is None:
            return
        pending = self._unconfirmed
        if multiple:
            tags = []
            for s in list(pending):
                if s > seq:
                    break
                tags.append(pending.pop(s))
        else:
            tag = pending.pop(seq, None)
            tags = [] if tag is None else [tag]
        if not tags:
            return
        if not ack:
            for tag in tags:  # the destination refused them: back to the source queue
                src.send(spec.Basic.Nack(delivery_tag=tag, multiple=False, requeue=True))
            self._taken -= len(tags)
            return
        if multiple and (not pending or min(pending.values()) > tags[-1]):
            src.ack(tags[-1], multiple=True)
        else:
            for tag in tags:
                src.ack(tag)
        self._settled(len(tags))

    def _settled(self, count: int) -> None:
        self.acked += count
        if delete_after_reached(self.d, self.acked, self.initial_length) and self._finished is not None \
                and not self._finished.done():
            self._finished.set_result(None)

    def status(self) -> dict[str, Any]:
        """RabbitMQ's /api/shovels fields for this shovel."""
        out: dict[str, Any] = {"node": self.node_name, "timestamp": _stamp(self.changed_at), "name": self.d.name,
                               "vhost": self.vhost, "type": "dynamic", "state": self.state}
        if self.state == "terminated":
            out["reason"] = self.reason
        if self.state == "running":
            for prefix, ep in (("src", self.d.source), ("dest", self.d.dest)):
                out.update({f"{prefix}_{k}": v for k, v in ep.describe().items()})
        out["messages_forwarded"] = self.forwarded
        out["messages_acknowledged"] = self.acked
        return out


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


async def _declare(link: AmqpLink, queue: str, args: Any) -> Any:
    """A queue as RabbitMQ's shovel declares it: passively first (so an existing queue of any type and
    arguments is used as it is), else durable with the given arguments."""
    try:
        return await link.call(spec.Queue.Declare(queue=queue, passive=True), spec.Queue.DeclareOk)
    except LinkClosed as exc:
        if exc.code != 404 or not link.channel_reopenable:
            raise
    await link.call(spec.Channel.Open(), spec.Channel.OpenOk)
    return await link.call(spec.Queue.Declare(queue=queue, durable=True, arguments=dict(args or {})),
                           spec.Queue.DeclareOk)


__all__ = ["ShovelWorker"]
