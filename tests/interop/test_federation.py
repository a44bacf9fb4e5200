"""Federation between two clusters of one (tests/cluster/nodes.py), with pika as the applications'
client: exchanges (bindings propagated upstream, max-hops, loop detection), queues (pulled while the
downstream queue has consumers and is empty), and links cut by killing a node and restored."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
from tests.cluster.nodes import Node, eventually
from tests.interop.test_shovel import PERSISTENT, channel, depth, drain, make_node


@pytest.fixture
def sites(tmp_path: Path) -> Iterator[tuple[Node, Node]]:
    """Two clusters of one, named site-a and site-b."""
    nodes = [make_node(tmp_path, name, f"cluster_name = site-{name}\n").start() for name in ("a", "b")]
    yield nodes[0], nodes[1]
    for n in nodes:
        n.stop()


def federate(down: Node, up: Node, pattern: str, apply_to: str, **upstream: Any) -> None:
    code, doc = down.api("PUT", "/api/parameters/federation-upstream/%2F/from-" + up.name,
                         {"value": {"uri": up.url, **upstream}})
    assert code in (201, 204), doc
    code, doc = down.api("PUT", "/api/policies/%2F/fed-" + apply_to,
                         {"pattern": pattern, "apply-to": apply_to, "definition": {"federation-upstream-set": "all"}})
    assert code in (201, 204), doc


def links(n: Node, status: str | None = None) -> list[dict[str, Any]]:
    code, doc = n.api("GET", "/api/federation-links")
    assert code == 200, doc
    return [link for link in doc if status is None or link["status"] == status]


def declare_exchange(n: Node, name: str = "fed.x") -> Any:
    ch = channel(n)
    ch.exchange_declare(name, "topic", durable=True)
    return ch


def exchange_on_both(up: Node, down: Node, queue: str, key: str) -> Any:
    """fed.x on both sites, `queue` bound to it downstream with `key`; the downstream channel."""
    declare_exchange(up).connection.close()
    ch = declare_exchange(down)
    ch.queue_declare(queue, durable=True)
    ch.queue_bind(queue, "fed.x", key)
    return ch


def test_an_exchange_federated_from_an_upstream(sites: tuple[Node, Node]) -> None:
    a, b = sites
    ch = exchange_on_both(a, b, "fed-q", "k.#")
    federate(b, a, r"^fed\.", "exchanges")
    (link,) = eventually(lambda: links(b, "running"), timeout=30)
    assert (link["type"], link["exchange"], link["upstream_exchange"], link["upstream"], link["vhost"]) == \
        ("exchange", "fed.x", "fed.x", "from-a", "/")
    # the downstream binding is propagated to the upstream's queue
    eventually(lambda: a.api("GET", "/api/queues/%2F/" + "federation%3A%20fed.x%20-%3E%20site-b")[0] == 200)
    pub = channel(a)
    eventually(lambda: pub.basic_publish("fed.x", "k.1", b"probe", PERSISTENT) or depth(b, "fed-q") > 0, timeout=30)
    drain(b, "fed-q")
    pub.basic_publish("fed.x", "k.2", b"hello", PERSISTENT)
    pub.basic_publish("fed.x", "z.1", b"not bound downstream", PERSISTENT)
    eventually(lambda: depth(b, "fed-q") == 1)
    method, props, body = ch.basic_get("fed-q", auto_ack=True)
    assert body == b"hello" and method.routing_key == "k.2"
    (hop,) = props.headers["x-received-from"]
    assert hop["exchange"] == "fed.x" and hop["cluster-name"] == "site-a" and "guest:guest" not in hop["uri"]
    # a binding added downstream later is propagated too
    ch.queue_declare("fed-q2", durable=True)
    ch.queue_bind("fed-q2", "fed.x", "other")
    eventually(lambda: pub.basic_publish("fed.x", "other", b"late", PERSISTENT) or depth(b, "fed-q2") > 0, timeout=30)
    out = b.ctl("federation_status")
    assert out.returncode == 0 and "from-a" in out.stdout and "running" in out.stdout
    pub.connection.close()
    ch.connection.close()
    # the policy goes: the link stops and deletes its queue upstream (which would otherwise fill up)
    assert b.api("DELETE", "/api/policies/%2F/fed-exchanges")[0] == 204
    eventually(lambda: links(b) == [], timeout=30)
    eventually(lambda: a.api("GET", "/api/queues/%2F/" + "federation%3A%20fed.x%20-%3E%20site-b")[0] == 404)


def test_the_link_is_cut_and_restored(sites: tuple[Node, Node]) -> None:
    a, b = sites
    exchange_on_both(a, b, "cut-q", "#").connection.close()
    federate(b, a, r"^fed\.", "exchanges", **{"reconnect-delay": 1})
    eventually(lambda: links(b, "running"), timeout=30)
    eventually(lambda: a.api("GET", "/api/queues/%2F/" + "federation%3A%20fed.x%20-%3E%20site-b")[0] == 200)
    # the downstream goes: what is published upstream meanwhile waits in the link's upstream queue
    b.kill()
    pub = channel(a)
    for i in range(100):
        pub.basic_publish("fed.x", "m", b"%d" % i, PERSISTENT)
    pub.connection.close()
    b.start()
    eventually(lambda: depth(b, "cut-q") == 100, timeout=60)
    # the upstream goes: the link reports the error, and runs again when the upstream is back
    a.kill()
    (err,) = eventually(lambda: links(b, "error"), timeout=30)
    assert err["error"] and "guest:guest" not in err["error"]
    a.start()
    eventually(lambda: links(b, "running"), timeout=60)
    pub = channel(a)
    pub.basic_publish("fed.x", "m", b"after", PERSISTENT)
    pub.connection.close()
    eventually(lambda: depth(b, "cut-q") == 101, timeout=30)
    assert sorted(drain(b, "cut-q")) == sorted([b"%d" % i for i in range(100)] + [b"after"])


def test_max_hops_and_loop_detection(sites: tuple[Node, Node]) -> None:
    a, b = sites
    for n in (a, b):
        ch = declare_exchange(n)
        ch.queue_declare("loop-q", durable=True)
        ch.queue_bind("loop-q", "fed.x", "#")
        ch.connection.close()
    # each federates the other: with max-hops 2 a message could come back, the cluster-name check stops it
    federate(b, a, r"^fed\.", "exchanges", **{"max-hops": 2})
    federate(a, b, r"^fed\.", "exchanges", **{"max-hops": 2})
    eventually(lambda: links(a, "running") and links(b, "running"), timeout=30)
    pub = channel(a)
    eventually(lambda: pub.basic_publish("fed.x", "p", b"probe", PERSISTENT) or depth(b, "loop-q") > 0, timeout=30)
    pub.basic_publish("fed.x", "p", b"once", PERSISTENT)
    eventually(lambda: b"once" in drain(b, "loop-q"), timeout=30)
    bodies = drain(a, "loop-q")
    assert bodies.count(b"once") == 1  # published here, not echoed back by b
    pub.connection.close()


def test_a_queue_pulls_from_its_upstream_while_it_has_consumers(sites: tuple[Node, Node]) -> None:
    a, b = sites
    up = channel(a)
    up.queue_declare("work", durable=True)
    for i in range(20):
        up.basic_publish("", "work", b"%d" % i, PERSISTENT)
    up.connection.close()
    down = channel(b)
    down.queue_declare("work", durable=True)
    federate(b, a, "^work$", "queues")
    (link,) = eventually(lambda: links(b, "running"), timeout=30)
    assert link["type"] == "queue" and link["queue"] == link["upstream_queue"] == "work"
    assert not link["consuming"] and depth(a, "work") == 20  # no consumer downstream: nothing pulled
    got: list[bytes] = []
    down.basic_consume("work", lambda ch, m, p, body: (got.append(body), ch.basic_ack(m.delivery_tag)))
    deadline_loops = 0
    while len(got) < 20 and deadline_loops < 600:
        down.connection.process_data_events(time_limit=0.1)
        deadline_loops += 1
    assert sorted(got) == sorted(b"%d" % i for i in range(20))
    assert depth(a, "work") == 0
    down.connection.close()
    eventually(lambda: not links(b)[0]["consuming"], timeout=30)  # the consumer went: the link stops pulling
    pub = pika.BlockingConnection(pika.URLParameters(a.url)).channel()
    pub.basic_publish("", "work", b"stays upstream", PERSISTENT)
    pub.connection.close()
    assert depth(a, "work") == 1
