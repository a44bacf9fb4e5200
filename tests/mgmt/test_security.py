"""The management listener under attack (issue 15; docs/security.md, "Management listener").

Each test reproduces an attack on a real hutch-server with real clients (pika, requests, raw sockets)
and checks the defence:
- a listing filter's regular expression that backtracks for minutes in Python's `re` (the node froze:
  a second client's AMQP round trips stalled) runs in linear time (RE2); a pattern RE2 refuses is a 400;
- an HTML form on another site (text/plain or urlencoded body, credentials in `?auth=`) cannot post
  definitions (415 / 401); a foreign `Origin` is 403; JSON with the Authorization header still works;
- silent sockets, dripped headers and stalled bodies are closed by the request/idle timeouts and their
  descriptors released; connections past `management.tcp.max_connections` are closed at once, and a
  legitimate request works again once the silent ones are gone;
- malformed requests log no traceback above DEBUG, and no log line carries a credential;
- an announced body over `management.http.max_body_size` is a 413 before it is sent; deeply nested JSON
  is a 400, not a 500;
- /metrics/per-object needs a monitoring login unless `prometheus.return_per_object_metrics = true`;
- the deprecated /api/healthchecks/node/ and /api/healthchecks/node/{node} answer {"status": "ok"}.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, StallProbe, connect, seg, unique, wait_for, wait_mgmt

GUEST = ("guest", "guest")
STALL_PATTERN = "(.*.*)*(.*.*)*#"  # Python's re: ~7 s at 12 characters here, x5 per character more
STALL_NAME = "x" * 13  # so the old code (re.search) stalled the node for well over 10 s


def _server(tmp_path: Path, config: str | None = None) -> Iterator[ServerInfo]:
    info = start_server(tmp_path, config_text=config)
    try:
        yield wait_mgmt(info)
    finally:
        info.stop()


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[ServerInfo]:
    """A node with short listener timeouts, a small connection cap and a small body limit."""
    yield from _server(tmp_path, "management.tcp.request_timeout = 3000\n"
                                 "management.tcp.idle_timeout = 1000\n"
                                 "management.tcp.inactivity_timeout = 4000\n"
                                 "management.tcp.max_connections = 20\n"
                                 "management.tcp.max_connections_per_source = 20\n"  # the cap, from one address
                                 "management.http.max_body_size = 1000\n")


# -- 1. user regular expressions --------------------------------------------------------------------


def test_listing_regex_runs_in_linear_time_and_the_node_keeps_answering(fresh_mgmt: ServerInfo):
    api = Api(fresh_mgmt.mgmt_url)
    vhost = unique("regex")
    assert api.put(f"/api/vhosts/{seg(vhost)}").status == 201
    assert api.put(f"/api/permissions/{seg(vhost)}/guest", {"configure": ".*", "write": ".*", "read": ".*"}
                   ).status in (201, 204)
    assert api.put(f"/api/queues/{seg(vhost)}/{STALL_NAME}", {"durable": False}).status == 201
    with StallProbe(fresh_mgmt.amqp_port, vhost=vhost, interval_s=0.01) as pings:
        time.sleep(0.2)
        for path in (f"/api/queues/{seg(vhost)}", f"/api/exchanges/{seg(vhost)}", "/api/queues"):
            reply = requests.get(fresh_mgmt.mgmt_url + path, auth=GUEST, timeout=120,
                                 params={"page": "1", "use_regex": "true", "name": STALL_PATTERN})
            assert reply.status_code == 200, reply.text
            assert reply.json()["filtered_count"] == 0
        time.sleep(0.2)
    assert pings.rounds > 5
    assert pings.longest_s < 2.0, f"AMQP round trips stalled for {pings.longest_s:.1f} s"  # old code: 25 s
    # matching still works, case-insensitively as RabbitMQ's
    reply = requests.get(fresh_mgmt.mgmt_url + f"/api/queues/{seg(vhost)}", auth=GUEST, timeout=10,
                         params={"page": "1", "use_regex": "true", "name": "^X{13}$"})
    assert [q["name"] for q in reply.json()["items"]] == [STALL_NAME]


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)b", "("])
def test_refused_patterns_are_a_400_with_the_reason(api: Api, pattern: str):
    reply = requests.get(api.base + "/api/queues", auth=GUEST, timeout=10,
                         params={"page": "1", "use_regex": "true", "name": pattern})
    assert reply.status_code == 400
    assert reply.json()["error"] == "bad_request"
    assert reply.json()["reason"].startswith(f"invalid regular expression {pattern!r}")
    # a topic permission's regular expression is validated with the same engine
    vhost = "/"
    reply = requests.put(api.base + f"/api/topic-permissions/{seg(vhost)}/guest", auth=GUEST, timeout=10,
                         json={"exchange": "amq.topic", "write": pattern, "read": ".*"})
    assert reply.status_code == 400 and "invalid regular expression" in reply.json()["reason"]


# -- 2. browser rules (CSRF) ------------------------------------------------------------------------


def _admin_document(name: str) -> bytes:
    return json.dumps({"users": [{"name": name, "password": "pwned", "tags": "administrator"}]}).encode()


def test_a_web_page_cannot_post_definitions(api: Api):
    name = unique("csrf-admin")
    token = base64.b64encode(b"guest:guest").decode()
    url = api.base + f"/api/definitions?auth={token}"
    # what <form enctype="text/plain" method="post"> (or urlencoded) sends: no Authorization header
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        reply = requests.post(url, data=_admin_document(name), headers={"Content-Type": content_type},
                              timeout=10)
        assert reply.status_code == 415, reply.text
        assert reply.json()["error"] == "unsupported_media_type"
    # multipart (a form's file upload) is a type the upload accepts, but ?auth= carries no credentials
    reply = requests.post(url, files={"file": ("d.json", _admin_document(name))}, timeout=10)
    assert reply.status_code == 401
    # a page on another origin, even one that somehow had the credentials
    reply = requests.post(api.base + "/api/definitions", data=_admin_document(name), auth=GUEST, timeout=10,
                          headers={"Content-Type": "application/json", "Origin": "http://evil.example"})
    assert reply.status_code == 403 and reply.json()["error"] == "forbidden"
    assert requests.get(api.base + f"/api/users/{name}", auth=GUEST, timeout=10).status_code == 404


def test_a_json_body_without_a_content_type_is_read_as_rabbitmq_reads_it(api: Api):
    # what rabbitmq-stream-js-client's suite sends (got with a string body): no Content-Type at all
    q = unique("untyped-q")
    path = api.base + f"/api/queues/%2F/{q}"
    req = requests.Request("PUT", path, data=b'{"durable": true, "arguments": {"x-max-length": 5}}', auth=GUEST)
    prepared = req.prepare()
    assert "Content-Type" not in prepared.headers
    with requests.Session() as session:
        assert session.send(prepared, timeout=10).status_code == 201
    assert requests.get(path, auth=GUEST, timeout=10).json()["arguments"] == {"x-max-length": 5}
    # ... but not from another origin
    reply = requests.put(api.base + f"/api/queues/%2F/{unique('untyped-q')}", data=b'{}', auth=GUEST, timeout=10,
                         headers={"Origin": "http://attacker.example"})
    assert reply.status_code == 403
    assert requests.delete(path, auth=GUEST, timeout=10).status_code == 204


def test_state_changing_requests_need_json_and_a_same_origin(api: Api):
    q = unique("csrf-q")
    path = api.base + f"/api/queues/%2F/{q}"
    reply = requests.put(path, data='{"durable": false}', auth=GUEST, headers={"Content-Type": "text/plain"},
                         timeout=10)
    assert reply.status_code == 415
    reply = requests.put(path, json={"durable": False}, auth=GUEST, timeout=10,
                         headers={"Origin": "http://attacker.example:15672"})
    assert reply.status_code == 403
    assert requests.get(path, auth=GUEST, timeout=10).status_code == 404
    # what the web UI sends: JSON, the Authorization header and its own origin
    reply = requests.put(path, json={"durable": False}, auth=GUEST, timeout=10, headers={"Origin": api.base})
    assert reply.status_code == 201
    # reading with a foreign Origin changes nothing and is answered (a page cannot read the reply)
    assert requests.get(path, auth=GUEST, timeout=10, headers={"Origin": "http://evil.example"}
                        ).status_code == 200
    # DELETE without a body and without Content-Type (curl -X DELETE) is fine; a foreign Origin is not
    assert requests.delete(path, auth=GUEST, timeout=10, headers={"Origin": "null"}).status_code == 403
    assert requests.delete(path, auth=GUEST, timeout=10).status_code == 204


# -- 3. timeouts and the connection cap ---------------------------------------------------------------


def _open_fds(info: ServerInfo) -> int:
    return len(os.listdir(f"/proc/{info.proc.pid}/fd"))


def _closed_by_peer(sock: socket.socket, within_s: float) -> bool:
    """Whether the server closes `sock` within `within_s` (reads to EOF or a reset)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _get_ok(info: ServerInfo) -> bool:
    try:
        return requests.get(info.mgmt_url + "/api/overview", auth=GUEST, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc to count descriptors")
def test_silent_sockets_are_closed_and_the_cap_holds(limited: ServerInfo):
    assert _get_ok(limited)
    time.sleep(0.5)  # the check's own connection is gone
    baseline = _open_fds(limited)
    silent = [socket.create_connection(("127.0.0.1", limited.management_port)) for _ in range(20)]
    try:
        assert wait_for(lambda: _open_fds(limited) >= baseline + 20, timeout=3)
        extra = [socket.create_connection(("127.0.0.1", limited.management_port)) for _ in range(10)]
        assert all(_closed_by_peer(s, 2.0) for s in extra), "connections past the cap are closed at once"
        for s in extra:
            s.close()
        assert not _get_ok(limited), "a 21st connection is refused while 20 are open"
        # the request timeout (3 s) closes the silent ones and releases their descriptors
        assert all(_closed_by_peer(s, 6.0) for s in silent)
        assert wait_for(lambda: _open_fds(limited) <= baseline + 2, timeout=3), (_open_fds(limited), baseline)
        assert _get_ok(limited)
    finally:
        for s in silent:
            s.close()
    assert "management.tcp.max_connections" in limited.log()  # the refusal was logged, once


def test_dripped_headers_and_stalled_bodies_time_out(limited: ServerInfo):
    drip = socket.create_connection(("127.0.0.1", limited.management_port))
    drip.sendall(b"GET /api/overview HTTP/1.1\r\nHost: x\r\n")
    started = time.monotonic()
    closed = False
    while time.monotonic() - started < 8:
        try:
            drip.sendall(b"X")  # a header that never ends, one byte every 0.2 s
        except OSError:
            closed = True
            break
        time.sleep(0.2)
    closed = closed or _closed_by_peer(drip, 0.5)
    drip.close()
    assert closed and time.monotonic() - started < 7, "the request timeout (3 s) ends a dripped head"
    stall = socket.create_connection(("127.0.0.1", limited.management_port))
    token = base64.b64encode(b"guest:guest").decode()
    stall.sendall(f"PUT /api/queues/%2F/{unique('stall')} HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}"
                  "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"dur".encode())
    stall.settimeout(5)
    started = time.monotonic()
    head = stall.recv(4096)
    stall.close()
    assert head.startswith(b"HTTP/1.1 408"), head
    assert time.monotonic() - started < 4


# -- 4. logs -------------------------------------------------------------------------------------------


def test_malformed_requests_log_no_traceback_and_no_credentials(fresh_mgmt: ServerInfo):
    secret = "s3cret-Passw0rd"
    token = base64.b64encode(f"guest:{secret}".encode()).decode()
    port = fresh_mgmt.management_port
    malformed = [
        b"GARBAGE\r\n\r\n",
        f"GET /api/overview HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\x01\r\n\r\n".encode(),
        f"GET /api/overview HTTP/1.1\r\nHost: x\r\nAuthorization Basic {token}\r\n\r\n".encode(),
        ("PUT /api/queues/%2F/chunky HTTP/1.1\r\nHost: x\r\nAuthorization: Basic "
         + base64.b64encode(b"guest:guest").decode()
         + "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n").encode(),
    ]
    for raw in malformed:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(raw)
            sock.settimeout(5)
            reply = sock.recv(4096)
            assert reply.split(b" ")[1] == b"400", (raw, reply)
    # a failed login, with the password in the header and a newline in the user name
    evil_user = "evil\nFAKE LOG LINE"
    reply = requests.get(fresh_mgmt.mgmt_url + "/api/overview", auth=(evil_user, secret), timeout=10)
    assert reply.status_code == 401
    reply = requests.put(fresh_mgmt.mgmt_url + "/api/users/u1", auth=GUEST, timeout=10,
                         json={"password": secret, "tags": ""})
    assert reply.status_code == 201
    assert requests.get(fresh_mgmt.mgmt_url + "/api/whoami", auth=("u1", "wrong"), timeout=10).status_code == 401
    time.sleep(0.3)
    log = fresh_mgmt.log()
    assert "Traceback" not in log
    assert secret not in log and token not in log
    assert "\nFAKE LOG LINE" not in log
    assert "HTTP access denied" in log  # the failed logins are logged, with the names escaped


# -- 5. bodies --------------------------------------------------------------------------------------


def _raw_request(info: ServerInfo, head: str, body: bytes = b"", timeout: float = 5) -> bytes:
    with socket.create_connection(("127.0.0.1", info.management_port)) as sock:
        sock.sendall(head.encode() + body)
        sock.settimeout(timeout)
        return sock.recv(65536)


def test_an_announced_oversized_body_is_refused_before_it_is_sent(mgmt: ServerInfo):
    token = base64.b64encode(b"guest:guest").decode()
    # RabbitMQ's default limit, 20 MiB: a 30 MB body is refused from its Content-Length alone (no byte of
    # it is sent here; the old code waited for it, then read up to 20 MB into memory)
    for method, path in (("PUT", f"/api/queues/%2F/{unique('big')}"), ("POST", "/api/definitions")):
        reply = _raw_request(mgmt, f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Basic {token}\r\n"
                                   "Content-Type: application/json\r\nContent-Length: 30000000\r\n\r\n")
        assert reply.startswith(b"HTTP/1.1 413"), reply
        assert b"Exceeded HTTP request body size limit" in reply


def test_body_limit_setting_and_chunked_bodies(limited: ServerInfo):
    url = limited.mgmt_url + f"/api/queues/%2F/{unique('limit')}"
    reply = requests.put(url, json={"durable": False, "arguments": {"x-pad": "p" * 2000}}, auth=GUEST, timeout=10)
    assert reply.status_code == 413
    assert "management.http.max_body_size" in reply.json()["reason"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused once the limit is passed
        yield b'{"arguments": {"x-pad": "'
        for _ in range(50):
            yield b"p" * 100
        yield b'"}}'

    reply = requests.put(url, data=chunks(), auth=GUEST, timeout=10, headers={"Content-Type": "application/json"})
    assert reply.status_code == 413
    assert requests.put(url, json={"durable": False}, auth=GUEST, timeout=10).status_code == 201


def test_deeply_nested_json_is_a_400(api: Api):
    nested = "[" * 100_000 + "]" * 100_000
    body = '{"durable": false, "arguments": {"x-n": ' + nested + "}}"
    reply = requests.put(api.base + f"/api/queues/%2F/{unique('deep')}", data=body, auth=GUEST, timeout=30,
                         headers={"Content-Type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert "nested deeper than" in reply.json()["reason"]
    reply = requests.post(api.base + "/api/definitions", data='{"queues": ' + nested + "}", auth=GUEST,
                          timeout=30, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400
    # brackets inside strings do not count; 64 levels are accepted
    ok = {"durable": False, "arguments": {"x-s": "[" * 1000, "x-n": json.loads("[" * 60 + "]" * 60)}}
    name = unique("deep-ok")
    assert requests.put(api.base + f"/api/queues/%2F/{name}", json=ok, auth=GUEST, timeout=10).status_code == 201
    assert requests.delete(api.base + f"/api/queues/%2F/{name}", auth=GUEST, timeout=10).status_code == 204


# -- 6. per-object metrics ----------------------------------------------------------------------------


def test_per_object_metrics_need_a_monitoring_login(clean_mgmt: ServerInfo):
    base = clean_mgmt.mgmt_url
    api = Api(base)
    secret_queue = unique("secret-queue")
    assert api.put(f"/api/queues/%2F/{secret_queue}", {"durable": False}).status == 201
    reply = requests.get(base + "/metrics/per-object", timeout=10)
    assert reply.status_code == 401 and secret_queue not in reply.text
    for user, tags, status in (("mon", "monitoring", 200), ("mgr", "management", 401), ("adm", "administrator", 200)):
        assert api.put(f"/api/users/{user}", {"password": "pw", "tags": tags}).status == 201
        reply = requests.get(base + "/metrics/per-object", auth=(user, "pw"), timeout=10)
        assert reply.status_code == status, (user, reply.text[:200])
        assert (secret_queue in reply.text) == (status == 200)
    reply = requests.get(base + "/metrics", timeout=10)  # aggregated: open, as RabbitMQ's plugin
    assert reply.status_code == 200 and secret_queue not in reply.text


@pytest.fixture
def per_object_open(tmp_path: Path) -> Iterator[ServerInfo]:
    yield from _server(tmp_path, "prometheus.return_per_object_metrics = true\n")


def test_return_per_object_metrics_opens_them(per_object_open: ServerInfo):
    q = unique("public-queue")
    with connect(per_object_open.amqp_port) as conn:
        conn.channel().queue_declare(q)
    for path in ("/metrics", "/metrics/per-object"):
        reply = requests.get(per_object_open.mgmt_url + path, timeout=10)
        assert reply.status_code == 200 and f'queue="{q}"' in reply.text, path


# -- 7. deprecated health checks (issue 16) --------------------------------------------------------------


def test_deprecated_node_health_checks(mgmt: ServerInfo):
    for path in ("/api/healthchecks/node", "/api/healthchecks/node/", "/api/healthchecks/node/test@localhost"):
        reply = requests.get(mgmt.mgmt_url + path, auth=GUEST, timeout=10)
        assert (reply.status_code, reply.json()) == (200, {"status": "ok"}), path
    reply = requests.get(mgmt.mgmt_url + "/api/healthchecks/node/nobody@nowhere", auth=GUEST, timeout=10)
    assert reply.status_code == 404
    assert requests.get(mgmt.mgmt_url + "/api/healthchecks/node/", timeout=10).status_code == 401

