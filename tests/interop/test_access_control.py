"""Access control against an in-process node (users and permissions are set through its AuthStore):
the permission each AMQP operation needs, allowed and denied, with RabbitMQ's refusal text; vhost
access; and the loopback-only rule for `guest`.

The matrix: for every operation, (1) with full permissions it succeeds; (2) for each permission it
requires, denying exactly that permission on exactly that resource refuses it with 403 and the text
naming that permission and resource; (3) denying the same permission on an unrelated resource does
not refuse it (the check is about the right resource)."""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.exceptions
import pytest

from .helpers import params, refused, unique
from .inproc import InProcNode

USER, PASSWORD = "matrix-user", "matrix-pass"


@pytest.fixture(scope="module")
def node() -> Iterator[InProcNode]:
    with InProcNode() as n:
        n.add_user(USER, PASSWORD)
        yield n


def _connect(node: InProcNode, user: str = USER, password: str = PASSWORD, **kw: Any) -> pika.BlockingConnection:
    return pika.BlockingConnection(params(node.amqp_port, user=user, password=password, **kw))


@dataclass
class Op:
    name: str
    action: Callable[[Any, dict[str, str]], None]
    needs: list[tuple[str, str, str]]  # (permission kind, resource type, key into the names)
    setup: Callable[[Any, dict[str, str]], None] = field(default=lambda ch, n: None)


def _round_trip(ch: Any, n: dict[str, str]) -> None:
    """An operation that needs no permission, to receive an asynchronous channel close."""
    ch.queue_declare(n["q"], passive=True)


def _publish(ch: Any, n: dict[str, str]) -> None:
    ch.basic_publish(n["x"], "k", b"m")
    _round_trip(ch, n)


def _publish_default(ch: Any, n: dict[str, str]) -> None:
    ch.basic_publish("", n["q"], b"m")
    _round_trip(ch, n)


OPS = [
    Op("exchange.declare", lambda ch, n: ch.exchange_declare(n["new"], "direct"),
       [("configure", "exchange", "new")]),
    Op("exchange.declare+alternate-exchange",
       lambda ch, n: ch.exchange_declare(n["new"], "direct", arguments={"alternate-exchange": n["x"]}),
       [("configure", "exchange", "new"), ("read", "exchange", "new"), ("write", "exchange", "x")]),
    Op("exchange.delete", lambda ch, n: ch.exchange_delete(n["new"]),
       [("configure", "exchange", "new")], setup=lambda ch, n: ch.exchange_declare(n["new"], "direct")),
    Op("queue.declare", lambda ch, n: ch.queue_declare(n["new"]), [("configure", "queue", "new")]),
    Op("queue.declare+dead-letter-exchange",
       lambda ch, n: ch.queue_declare(n["new"], arguments={"x-dead-letter-exchange": n["x"]}),
       [("configure", "queue", "new"), ("read", "queue", "new"), ("write", "exchange", "x")]),
    Op("queue.delete", lambda ch, n: ch.queue_delete(n["new"]), [("configure", "queue", "new")],
       setup=lambda ch, n: ch.queue_declare(n["new"])),
    Op("queue.purge", lambda ch, n: ch.queue_purge(n["q"]), [("read", "queue", "q")]),
    Op("queue.bind", lambda ch, n: ch.queue_bind(n["q"], n["x"], "k"),
       [("write", "queue", "q"), ("read", "exchange", "x")]),
    Op("queue.unbind", lambda ch, n: ch.queue_unbind(n["q"], n["x"], "k"),
       [("write", "queue", "q"), ("read", "exchange", "x")],
       setup=lambda ch, n: ch.queue_bind(n["q"], n["x"], "k")),
    Op("exchange.bind", lambda ch, n: ch.exchange_bind(n["d"], n["x"], "k"),
       [("write", "exchange", "d"), ("read", "exchange", "x")]),
    Op("exchange.unbind", lambda ch, n: ch.exchange_unbind(n["d"], n["x"], "k"),
       [("write", "exchange", "d"), ("read", "exchange", "x")],
       setup=lambda ch, n: ch.exchange_bind(n["d"], n["x"], "k")),
    Op("basic.publish", _publish, [("write", "exchange", "x")]),
    Op("basic.publish(default exchange)", _publish_default, [("write", "exchange", "")]),
    Op("basic.consume", lambda ch, n: ch.basic_consume(n["q"], lambda *a: None), [("read", "queue", "q")]),
    Op("basic.get", lambda ch, n: ch.basic_get(n["q"]), [("read", "queue", "q")]),
]


def _resource_name(names: dict[str, str], key: str) -> str:
    return names[key] if key else ""


def _deny_only(name: str) -> str:
    """A permission regex that allows everything except exactly `name` (amq.default for ""). Without
    lookahead, which RE2 (the engine of permission regexes) does not have: a name differs from `name`
    at some position, or is a proper prefix of it, or is longer."""
    name = name or "amq.default"
    differs = [f"{re.escape(name[:i])}(?:[^{re.escape(name[i])}]|$)" for i in range(len(name))]
    return "^(?:" + "|".join([*differs, re.escape(name) + "."]) + ")"


def _cases() -> list[Any]:
    cases = []
    for op in OPS:
        cases.append(pytest.param(op, None, True, id=f"{op.name}-allowed"))
        for need in op.needs:
            kind, rtype, _key = need
            cases.append(pytest.param(op, need, False, id=f"{op.name}-no-{kind}-{rtype}-{need[2] or 'default'}"))
            cases.append(pytest.param(op, need, True, id=f"{op.name}-no-{kind}-elsewhere"))
    return cases


@pytest.mark.parametrize(("op", "denied", "same_resource"), _cases())
def test_permission_matrix(node, op, denied, same_resource):
    names = {"x": unique("ac-x"), "d": unique("ac-d"), "q": unique("ac-q"), "new": unique("ac-new"), "": ""}
    admin = _connect(node, "guest", "guest")
    try:
        ach = admin.channel()
        ach.exchange_declare(names["x"], "direct")
        ach.exchange_declare(names["d"], "direct")
        ach.queue_declare(names["q"])
        op.setup(ach, names)
    finally:
        admin.close()

    perms = {"configure": ".*", "write": ".*", "read": ".*"}
    if denied is not None:
        kind, rtype, key = denied
        target = _resource_name(names, key) if same_resource else unique("unrelated")
        perms[kind] = _deny_only(target)
    node.set_permissions(USER, "/", **perms)

    conn = _connect(node)
    try:
        ch = conn.channel()
        if denied is None or not same_resource:
            op.action(ch, names)
            assert ch.is_open
        else:
            kind, rtype, key = denied
            shown = _resource_name(names, key) or "amq.default"
            with refused(403, f"ACCESS_REFUSED - {kind} access to {rtype} '{shown}' in vhost '/' refused for "
                              f"user '{USER}'"):
                op.action(ch, names)
    finally:
        if conn.is_open:
            conn.close()


def test_permission_changes_apply_to_open_channels(node):
    node.set_permissions(USER, "/")
    q = unique("ac-live")
    conn = _connect(node)
    try:
        ch = conn.channel()
        ch.queue_declare(q)
        ch.basic_get(q)  # allowed, and cached by the channel
        node.set_permissions(USER, "/", read="^$")
        with refused(403):
            ch.basic_get(q)
    finally:
        conn.close()
        node.set_permissions(USER, "/")


def test_narrowed_write_permission_applies_to_the_exchange_a_channel_keeps_publishing_to(node):
    node.set_permissions(USER, "/")
    conn = _connect(node)
    try:
        ch = conn.channel()
        ch.basic_publish("amq.topic", "k", b"1")  # allowed, and remembered by the channel
        ch.basic_publish("amq.topic", "k", b"2")
        node.set_permissions(USER, "/", write="^$")
        with refused(403):
            ch.basic_publish("amq.topic", "k", b"3")
            ch.basic_qos(prefetch_count=1)  # a synchronous call reports the channel's close
    finally:
        if conn.is_open:
            conn.close()
        node.set_permissions(USER, "/")


def test_user_without_vhost_permissions_is_refused_530(node):
    node.call(lambda: node.node.auth.add_user("no-perms", "pw"))
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        _connect(node, "no-perms", "pw")
    assert "(530)" in str(info.value)
    assert "NOT_ALLOWED - access to vhost '/' refused for user 'no-perms'" in str(info.value)


def test_user_with_permissions_on_other_vhost(node):
    node.add_vhost("other-vhost")
    node.add_user("vhost-user", "pw", vhost="other-vhost")
    conn = _connect(node, "vhost-user", "pw", vhost="other-vhost")
    try:
        ch = conn.channel()
        q = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", q, b"in other vhost")
        assert ch.basic_get(q, auto_ack=True)[2] == b"in other vhost"
    finally:
        conn.close()
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
        _connect(node, "vhost-user", "pw", vhost="/")


def test_vhosts_are_isolated(node):
    node.add_vhost("iso-a")
    node.add_user("iso", "pw", vhost="iso-a")
    q = unique("iso-q")
    guest = _connect(node, "guest", "guest")
    conn = _connect(node, "iso", "pw", vhost="iso-a")
    try:
        guest.channel().queue_declare(q)
        with refused(404, f"NOT_FOUND - no queue '{q}' in vhost 'iso-a'"):
            conn.channel().queue_declare(q, passive=True)
    finally:
        guest.close()
        conn.close()


def test_non_guest_user_logs_in(node):
    node.add_user("plain-user", "secret")
    conn = _connect(node, "plain-user", "secret")
    try:
        assert conn.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    finally:
        conn.close()


def test_wrong_password_for_created_user(node):
    node.add_user("pw-user", "right")
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        _connect(node, "pw-user", "wrong")


def _non_loopback_ip() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, this only picks a source address
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_guest_only_from_loopback():
    ip = _non_loopback_ip()
    with InProcNode(amqp_host="0.0.0.0", loopback_users=("guest",)) as n:
        n.add_user("remote-ok", "pw")
        conn = pika.BlockingConnection(params(n.amqp_port))  # guest over 127.0.0.1
        conn.close()
        if ip is None:
            pytest.skip("no non-loopback address on this machine to connect from")
        remote = pika.ConnectionParameters(ip, n.amqp_port, credentials=pika.PlainCredentials("guest", "guest"),
                                           connection_attempts=1, socket_timeout=5)
        with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
            pika.BlockingConnection(remote)
        assert ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see "
                "the broker logfile.") in str(info.value)
        other = pika.ConnectionParameters(ip, n.amqp_port, credentials=pika.PlainCredentials("remote-ok", "pw"),
                                          connection_attempts=1, socket_timeout=5)
        conn = pika.BlockingConnection(other)
        assert conn.channel().is_open
        conn.close()


def test_loopback_rule_can_be_lifted():
    ip = _non_loopback_ip()
    if ip is None:
        pytest.skip("no non-loopback address on this machine to connect from")
    with InProcNode(amqp_host="0.0.0.0", loopback_users=()) as n:
        remote = pika.ConnectionParameters(ip, n.amqp_port, credentials=pika.PlainCredentials("guest", "guest"),
                                           connection_attempts=1, socket_timeout=5)
        conn = pika.BlockingConnection(remote)
        assert conn.channel().is_open
        conn.close()
