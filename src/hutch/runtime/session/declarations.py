"""Channel handlers for the exchange and queue classes: declare, bind, unbind, purge, delete.

Owns: the permission checks and argument handling of topology methods, as RabbitMQ does them
(configure on the declared/deleted resource; write on a binding's destination and read on its source;
read for purge). The state changes themselves are the vhost's (`hutch.core.vhost`).
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from hutch.amqp import spec
from hutch.amqp.errors import ACCESS_REFUSED, NOT_FOUND, PRECONDITION_FAILED, ChannelError
from hutch.core.queue_type import Queue
from hutch.core.routing import exchange_dest, queue_dest
from hutch.core.vhost import rs

if TYPE_CHECKING:
    from hutch.core.auth import PermissionKind
    from hutch.core.vhost import VirtualHost
    from hutch.runtime.ports import BrokerPort, SessionConnection



class DeclarationsMixin:
    vhost: VirtualHost
    conn: SessionConnection
    node: BrokerPort
    last_queue_name: str | None
    prepared_reply_token: str | None

    def send(self, method: spec.Method) -> None:  # provided by the channel
        raise NotImplementedError

    def check_permission(self, kind: PermissionKind, resource_type: str, name: str) -> None:
        raise NotImplementedError

    # -- exchanges -----------------------------------------------------------------------------
    def _exchange_declare(self, m: Any) -> None:
        name = m.exchange
        if name == "":  # passive too, as RabbitMQ does
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if m.passive:
            self.vhost.lookup_exchange(name)
        else:
            self.check_permission("configure", "exchange", name)
            args = m.arguments or {}
            ae = args.get("alternate-exchange")
            if ae is not None:
                if not isinstance(ae, str):
                    raise ChannelError(PRECONDITION_FAILED,
                                       f"invalid arg 'alternate-exchange' for {rs('exchange', name, self.vhost.name)}")
                if name not in self.vhost.exchanges:  # as RabbitMQ: read on it, write on the AE
                    self.check_permission("read", "exchange", name)
                    self.check_permission("write", "exchange", ae)
            self.node.declare_exchange(self.vhost, name, m.type, m.durable, m.auto_delete, m.internal, args)
        if not m.nowait:
            self.send(spec.Exchange.DeclareOk())

    def _exchange_delete(self, m: Any) -> None:
        name = m.exchange
        if name and not name.startswith("amq."):
            self.check_permission("configure", "exchange", name)
        self.node.delete_exchange(self.vhost, name, m.if_unused)
        if not m.nowait:
            self.send(spec.Exchange.DeleteOk())

    def _exchange_bind(self, m: Any) -> None:
        self._bind_exchanges(m, unbind=False)
        if not m.nowait:
            self.send(spec.Exchange.BindOk())

    def _exchange_unbind(self, m: Any) -> None:
        self._bind_exchanges(m, unbind=True)
        if not m.nowait:
            self.send(spec.Exchange.UnbindOk())

    def _bind_exchanges(self, m: Any, unbind: bool) -> None:
        vhost = self.vhost
        self.check_permission("write", "exchange", m.destination)
        self.check_permission("read", "exchange", m.source)
        if m.destination == "" or m.source == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if unbind and (m.source not in vhost.exchanges or m.destination not in vhost.exchanges):
            return
        vhost.lookup_exchange(m.destination)
        source = vhost.lookup_exchange(m.source)
        args = m.arguments or {}
        if unbind:
            self.node.unbind(vhost, source, exchange_dest(m.destination), m.routing_key, args)
        else:
            self.node.bind(vhost, source, exchange_dest(m.destination), m.routing_key, args)

    # -- queues --------------------------------------------------------------------------------
    def _queue_for(self, name: str) -> Queue:
        """Resolve a queue name, "" meaning the last queue declared on this channel."""
        if name == "":
            if self.last_queue_name is None:
                raise ChannelError(NOT_FOUND, "no previously declared queue")
            name = self.last_queue_name
        return self.vhost.lookup_queue(name)

    def _queue_declare(self, m: Any) -> None:
        vhost = self.vhost
        name = m.queue
        if name.startswith("amq.rabbitmq.reply-to"):
            self._declare_reply_to(name, m.nowait)
            return
        if m.passive:
            q = self._queue_for(name)
            vhost.check_exclusive(q, self.conn)
        else:
            if name == "":
                name = "amq.gen-" + secrets.token_urlsafe(16)
            elif name.startswith("amq."):
                raise ChannelError(ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
            self.check_permission("configure", "queue", name)
            args = m.arguments or {}
            dlx = args.get("x-dead-letter-exchange")
            if isinstance(dlx, str) and name not in vhost.queues:  # as RabbitMQ: on creation only
                self.check_permission("read", "queue", name)
                self.check_permission("write", "exchange", dlx)
            q = self.node.declare_queue(vhost, name, m.durable, m.exclusive, m.auto_delete, args, self.conn)
        self.last_queue_name = q.name
        if not m.nowait:
            self.send(spec.Queue.DeclareOk(queue=q.name, message_count=q.message_count,
                                           consumer_count=q.consumer_count))

    def _declare_reply_to(self, name: str, nowait: bool) -> None:
        """Direct Reply-To pseudo queues, as RabbitMQ answers them: declaring (passively or not)
        "amq.rabbitmq.reply-to" is always OK with one consumer (clients such as faststream do it
        before consuming); "amq.rabbitmq.reply-to.<token>" is OK while the requester's channel lives."""
        prepared, self.prepared_reply_token = self.prepared_reply_token, None
        if name != "amq.rabbitmq.reply-to":
            token = name[len("amq.rabbitmq.reply-to."):] if name[21:22] == "." else None
            # a token of another node or worker: alive if that node said so (its token_node, asked by the gate)
            if token is None or (token not in self.node.reply_channels and token != prepared):
                raise ChannelError(NOT_FOUND, f"no queue '{name}' in vhost '{self.vhost.name}'")
        if not nowait:
            self.send(spec.Queue.DeclareOk(queue=name, message_count=0, consumer_count=1))

    def _queue_bind(self, m: Any) -> None:
        q, x = self._binding_ends(m)
        assert q is not None and x is not None
        self.node.bind(self.vhost, x, queue_dest(q.name), m.routing_key, m.arguments or {})
        if not m.nowait:
            self.send(spec.Queue.BindOk())

    def _queue_unbind(self, m: Any) -> None:
        q, x = self._binding_ends(m, missing_ok=True)
        if q is not None and x is not None:
            self.node.unbind(self.vhost, x, queue_dest(q.name), m.routing_key, m.arguments or {})
        self.send(spec.Queue.UnbindOk())

    def _binding_ends(self, m: Any, missing_ok: bool = False) -> tuple[Queue | None, Any]:
        vhost = self.vhost
        qname = m.queue or self.last_queue_name or ""
        self.check_permission("write", "queue", qname)
        self.check_permission("read", "exchange", m.exchange)
        if m.exchange == "":
            raise ChannelError(ACCESS_REFUSED, "operation not permitted on the default exchange")
        if missing_ok and (qname not in vhost.queues or m.exchange not in vhost.exchanges):
            return None, None
        q = self._queue_for(m.queue)
        vhost.check_exclusive(q, self.conn)
        return q, vhost.lookup_exchange(m.exchange)

    def _queue_purge(self, m: Any) -> None:
        q = self._queue_for(m.queue)
        self.check_permission("read", "queue", q.name)
        self.vhost.check_exclusive(q, self.conn)
        count = q.purge()
        if not m.nowait:
            self.send(spec.Queue.PurgeOk(message_count=count))

    def _queue_delete(self, m: Any) -> None:
        vhost = self.vhost
        name = m.queue or self.last_queue_name or ""
        self.check_permission("configure", "queue", name)
        q = vhost.queues.get(name)
        count = 0
        if q is not None:
            vhost.check_exclusive(q, self.conn)
            if m.if_unused and q.consumer_count:
                raise ChannelError(PRECONDITION_FAILED, f"{rs('queue', q.name, vhost.name)} in use")
            if m.if_empty and q.message_count:
                raise ChannelError(PRECONDITION_FAILED, f"{rs('queue', q.name, vhost.name)} not empty")
            count = self.node.delete_queue(vhost, q)
        if not m.nowait:
            self.send(spec.Queue.DeleteOk(message_count=count))
