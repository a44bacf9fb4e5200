"""Issue 21, items 1 and 6: user patterns and JSON bodies at the sizes a hostile user sends.

Each test runs a `StallProbe` (a second client doing AMQP round trips every 20 ms) beside the attack and
bounds its longest round trip generously (the measured figures are in docs/security.md):
- RE2 patterns are capped (`core/patterns.py`: 1,024 characters, 2,048 RE2 instructions): the issue's
  4,091-character alternation is a 400 at once, over a listing filter and as a policy pattern; the
  costliest pattern under the caps is matched over many 254-character names off the loop (a listing) or
  in slices (a policy), and a topic permission's result is cached per routing key;
- large JSON bodies are admitted one at a time and decoded with orjson; a non-administrator's body is
  capped (`management.http.max_body_size_non_admin`, 413).
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import string
import threading
from typing import Any

import re2

from conftest import ServerInfo  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, StallProbe, connect, seg, unique, wait_for

GUEST = ("guest", "guest")
NAME_CHARS = 254
QUEUES = 100


def _alternation(max_chars: int, max_program: int | None = None, seed: int = 21) -> str:
    """`[^c]{k}0|...`: RE2's costliest kind of pattern (its DFA gives up; every character walks the whole
    program). Names of lowercase letters never match. At most `max_chars`, and `max_program` RE2
    instructions case-insensitively (as a listing filter compiles it)."""
    rnd = random.Random(seed)
    parts: list[str] = []
    while True:
        part = f"[^{rnd.choice(string.ascii_lowercase)}]{{{rnd.randint(3, 9)}}}0"
        candidate = "|".join([*parts, part])
        if len(candidate) > max_chars:
            break
        if max_program is not None:
            options = re2.Options()
            options.case_sensitive = False
            if re2.compile(candidate, options=options).programsize > max_program:
                break
        parts.append(part)
    return "|".join(parts)


HUGE = _alternation(4091)  # the size: 12.6 s on the loop over 100 names of 254 characters
CAPPED = _alternation(1024, max_program=2000)  # the worst that is still accepted


def _names(prefix: str) -> list[str]:
    rnd = random.Random(1)
    return [f"{i:03d}" + "".join(rnd.choice(string.ascii_lowercase) for _ in range(NAME_CHARS - 3))
            for i in range(QUEUES)]


def _vhost_with_queues(api: Api, info: ServerInfo, user: str, tags: str) -> tuple[str, list[str]]:
    vhost = unique("scale")
    assert api.put(f"/api/vhosts/{seg(vhost)}").status == 201
    assert api.put(f"/api/users/{user}", {"password": "pw", "tags": tags}).status in (201, 204)
    for who in (user, "guest"):
        assert api.put(f"/api/permissions/{seg(vhost)}/{who}",
                       {"configure": ".*", "write": ".*", "read": ".*"}).status in (201, 204)
    names = _names(vhost)
    conn = connect(info.amqp_port, vhost=vhost)
    ch = conn.channel()
    for name in names:
        ch.queue_declare(name)
    conn.close()
    return vhost, names


def _listing(info: ServerInfo, vhost: str, pattern: str, user: str) -> tuple[int, Any]:
    """GET a page of a vhost's queues filtered by `pattern`, sent unquoted but for '&', '#', '+', '%'
    and ' ' (as a browser sends `[^a]{5}0|`), so a 4,091-character pattern fits aiohttp's 8 KiB line."""
    quoted = pattern.replace("%", "%25").replace("&", "%26").replace("#", "%23").replace("+", "%2B")
    path = f"/api/queues/{seg(vhost)}?page=1&use_regex=true&name={quoted.replace(' ', '%20')}"
    conn = http.client.HTTPConnection("127.0.0.1", info.management_port, timeout=120)
    try:
        token = base64.b64encode(f"{user}:pw".encode()).decode()
        conn.request("GET", path, headers={"Authorization": f"Basic {token}"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        conn.close()


def test_listing_regex_at_scale_is_capped_and_matched_off_the_loop(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    """Issue 21 item 1: a management user's 4,091-character alternation over 100 queues of 254-character
    names answered 200 after 12.6 s with the loop stalled as long. Now it is a 400 at once; the costliest
    pattern under the caps (~2,000 RE2 instructions) is matched off the loop: stall 0.87 s here before, none
    measurable now (docs/security.md)."""
    vhost, names = _vhost_with_queues(clean_api, clean_mgmt, "lister", "management")
    with StallProbe(clean_mgmt.amqp_port) as probe:
        huge_status, huge = _listing(clean_mgmt, vhost, HUGE, "lister")
        capped_status, capped = _listing(clean_mgmt, vhost, f"^007|^042|{CAPPED}", "lister")
    assert huge_status == 400, huge_status
    assert "longer than 1024 characters" in huge["reason"]
    assert capped_status == 200, capped
    assert [q["name"] for q in capped["items"]] == [names[7], names[42]]
    assert probe.rounds > 3
    assert probe.longest_s < 1.0, f"AMQP round trips stalled {probe.longest_s:.2f} s"


def test_policy_pattern_at_scale_is_capped_and_applied_in_slices(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    """Issue 21 item 1: a policymaker confined to one vhost set a 4,091-character pattern over 100 queues
    of 254-character names: an 11.3 s stall of every vhost. Now 400 at once; the costliest pattern under
    the caps is applied in 20 ms slices (and each (pattern, name) result is cached)."""
    vhost, names = _vhost_with_queues(clean_api, clean_mgmt, "maker", "policymaker")
    maker = clean_api.as_user("maker", "pw")
    with StallProbe(clean_mgmt.amqp_port) as probe:
        huge = maker.put(f"/api/policies/{seg(vhost)}/huge", {"pattern": HUGE, "apply-to": "queues",
                                                               "definition": {"max-length": 10}})
        capped = maker.put(f"/api/policies/{seg(vhost)}/capped", {
            "pattern": f"^007|{CAPPED}", "apply-to": "queues", "definition": {"max-length": 10}})
        again = maker.put(f"/api/policies/{seg(vhost)}/capped", {
            "pattern": f"^042|{CAPPED}", "apply-to": "queues", "definition": {"max-length": 10}})
    assert huge.status == 400, huge.body
    assert "longer than 1024 characters" in huge.body["reason"]
    assert capped.status == 201 and again.status == 204
    assert probe.rounds > 3
    assert probe.longest_s < 1.0, f"AMQP round trips stalled {probe.longest_s:.2f} s"

    def applied() -> dict[str, str | None]:  # the last slices may still be running, as on RabbitMQ
        return {q["name"]: q.get("policy") for q in clean_api.ok(f"/api/queues/{seg(vhost)}")}

    assert wait_for(lambda: applied()[names[42]] == "capped" and applied()[names[7]] is None, 30)
    assert sum(1 for p in applied().values() if p) == 1


def test_topic_permission_result_is_cached_per_routing_key(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    """Issue 21 item 1: an administrator's large topic-permission pattern cost ~50 ms per publish (a
    4,091-character one; 2.5 s for 50 publishes sent at once). Now the pattern is refused over 1,024
    characters, and a capped one's result is cached per (pattern, routing key): one search, then lookups."""
    assert clean_api.put("/api/users/topics", {"password": "pw", "tags": ""}).status == 201
    assert clean_api.put("/api/permissions/%2F/topics", {"configure": ".*", "write": ".*", "read": ".*"}
                         ).status in (201, 204)
    huge = clean_api.put("/api/topic-permissions/%2F/topics", {"exchange": "amq.topic", "write": HUGE, "read": ".*"})
    assert huge.status == 400 and "longer than 1024 characters" in huge.body["reason"]
    assert clean_api.put("/api/topic-permissions/%2F/topics", {
        "exchange": "amq.topic", "write": f"^ok\\.|{CAPPED}", "read": ".*"}).status in (201, 204)
    conn = connect(clean_mgmt.amqp_port, "topics", "pw")
    ch = conn.channel()
    key = "ok." + "k" * 250
    with StallProbe(clean_mgmt.amqp_port) as probe:
        for _ in range(50):
            ch.basic_publish("amq.topic", key, b"x")
        ch.queue_declare(unique("sync"), exclusive=True)  # a round trip: every publish was handled
    conn.close()
    assert probe.longest_s < 1.0, f"AMQP round trips stalled {probe.longest_s:.2f} s"


def _big_body(target_bytes: int = 19_900_000) -> bytes:
    """A queue declaration carrying ~19.9 MB of small JSON objects (the management API ignores unknown
    keys; the cost is in decoding them)."""
    item = {"name": "queue-000000", "vhost": "/", "durable": True, "arguments": {"x-max-length": 1}}
    count = target_bytes // (len(json.dumps(item)) + 2)
    return json.dumps({"durable": False, "junk": [item] * count}).encode()


def _put(info: ServerInfo, path: str, body: bytes, user: str = "guest", password: str = "guest") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", info.management_port, timeout=120)
    try:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        conn.request("PUT", path, body=body, headers={"Authorization": f"Basic {token}",
                                                      "Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        return reply.status
    except (ConnectionError, OSError):  # the server answered before reading the whole body, and closed
        return -1
    finally:
        conn.close()


def test_big_json_bodies_take_turns_and_do_not_stall_the_loop(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    """Issue 21 item 6: one 19.9 MB PUT by a management user stalled the loop 1.4 s (RSS 96 -> 657 MB),
    four in parallel 2.4 s (1.72 GB). Now bodies are decoded with orjson with the cycle collector paused
    and large ones take turns: measured stalls in docs/security.md."""
    body = _big_body()
    assert len(body) < 20 * 1024 * 1024
    with StallProbe(clean_mgmt.amqp_port) as one:
        assert _put(clean_mgmt, "/api/queues/%2F/big-0", body) == 201
    statuses: list[int] = []
    with StallProbe(clean_mgmt.amqp_port) as four:
        threads = [threading.Thread(target=lambda n=n: statuses.append(_put(clean_mgmt, f"/api/queues/%2F/big-{n}",
                                                                            body)))
                   for n in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    assert sorted(statuses) == [201] * 4
    # generous bounds for a shared 2-core machine; before: 1.27 s and 2.11 s here, 1.4 s and 2.4 s in the issue
    assert one.longest_s < 1.0, f"one body: AMQP round trips stalled {one.longest_s:.2f} s"
    assert four.longest_s < 1.5, f"four bodies: AMQP round trips stalled {four.longest_s:.2f} s"


def test_a_non_administrators_body_is_capped(clean_api: Api, clean_mgmt: ServerInfo) -> None:
    """Issue 21 item 6: a management user could send 20 MB bodies (the administrators' limit). Now a user
    without the administrator tag may send at most 1 MiB (`management.http.non_admin_max_body_size`): 413
    before the body is read; an administrator's body of the same size is accepted."""
    assert clean_api.put("/api/users/manager", {"password": "pw", "tags": "management"}).status == 201
    assert clean_api.put("/api/permissions/%2F/manager", {"configure": ".*", "write": ".*", "read": ".*"}
                         ).status in (201, 204)
    body = _big_body(2_000_000)
    assert _put(clean_mgmt, "/api/queues/%2F/from-manager", body, "manager", "pw") in (413, -1)
    conn = http.client.HTTPConnection("127.0.0.1", clean_mgmt.management_port, timeout=30)
    try:  # the reply names the limit (sent with its length announced, before the body)
        token = base64.b64encode(b"manager:pw").decode()
        conn.putrequest("PUT", "/api/queues/%2F/from-manager")
        for key, value in (("Authorization", f"Basic {token}"), ("Content-Type", "application/json"),
                           ("Content-Length", str(len(body)))):
            conn.putheader(key, value)
        conn.endheaders()
        reply = conn.getresponse()
        assert reply.status == 413
        assert "non_admin_max_body_size" in json.loads(reply.read())["reason"]
    finally:
        conn.close()
    small = json.dumps({"durable": False}).encode()
    assert _put(clean_mgmt, "/api/queues/%2F/from-manager", small, "manager", "pw") == 201
    assert _put(clean_mgmt, "/api/queues/%2F/from-admin", body) == 201
