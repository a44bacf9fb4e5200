"""Browser tests of the operator pages of the web UI (issue 22; docs/web-ui.md): the stale-node warning,
definitions export and import, limits, a queue's arguments as text, the detail pages, narrow screens.

Two hutch-servers: node A, with a DLX/TTL queue, a vhost and a user to limit, limits set through the
API and with hutchctl, and a pika connection in confirm mode with a consumer (for the connection and channel pages); and
node B, fresh. `node operator.spec.mjs` drives headless Debian chromium through playwright-core, as
test_ui.py does; it stops node A with SIGSTOP (its pid is given) to see the stale warning, and SIGCONT
to see it clear. Then, over AMQP and the API:

- the limits the browser set are enforced: the user's second connection and the vhost's second queue
  are refused, with RabbitMQ's codes (530 NOT_ALLOWED from connection.open, 406 PRECONDITION_FAILED);
- node B, which got node A's definitions file through the browser (download, then upload), has the
  same definitions as node A.

Skipped, with the reason, without chromium, node or tests/browser/node_modules (`make browser-deps`).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, ProbableAccessDeniedError
from tests.browser.test_ui import ARTIFACTS, BROWSER_DIR, CHROMIUM, STATS_CONFIG, Traffic, _missing_tools
from tests.conftest import ServerInfo, start_server
from tests.mgmt.helpers import run_ctl

SPEC_TIMEOUT_S = 240
DLX_QUEUE = "ui-dlx"
LIMITED_USER = "ui-limited"
LIMITED_PASSWORD = "ui-limited-secret"
CAPPED_VHOST = "ui-capped"


def _call(info: ServerInfo, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(info.mgmt_url + path, data=data, method=method, headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
        "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read()
    return json.loads(text) if text else None


def _setup(info: ServerInfo) -> None:
    """What the browser finds on node A: a vhost and a user to limit, a limit set through the API, a
    dead-lettering queue with a TTL and a length limit."""
    _call(info, "PUT", f"/api/vhosts/{CAPPED_VHOST}", {"description": "a vhost the UI limits"})
    _call(info, "PUT", f"/api/permissions/{CAPPED_VHOST}/guest", {"configure": ".*", "write": ".*", "read": ".*"})
    _call(info, "PUT", f"/api/users/{LIMITED_USER}", {"password": LIMITED_PASSWORD, "tags": ""})
    _call(info, "PUT", f"/api/permissions/%2F/{LIMITED_USER}", {"configure": ".*", "write": ".*", "read": ".*"})
    _call(info, "PUT", f"/api/topic-permissions/%2F/{LIMITED_USER}",
          {"exchange": "amq.topic", "write": "^orders\\.", "read": ".*"})
    _call(info, "PUT", f"/api/user-limits/{LIMITED_USER}/max-channels", {"value": 7})  # the API's: the UI shows it
    done = run_ctl(info, "set_vhost_limits", "-p", CAPPED_VHOST, '{"max-connections": 50}')  # and hutchctl's
    assert done.returncode == 0, done.stderr
    conn = pika.BlockingConnection(pika.URLParameters(info.url))
    ch = conn.channel()
    ch.exchange_declare("ui-dead", "direct", durable=True)
    ch.queue_declare("ui-dead-letters", durable=True)
    ch.queue_bind("ui-dead-letters", "ui-dead", "expired")
    ch.queue_declare(DLX_QUEUE, durable=True, arguments={
        "x-dead-letter-exchange": "ui-dead", "x-dead-letter-routing-key": "expired", "x-message-ttl": 60000,
        "x-max-length": 100, "x-overflow": "reject-publish"})
    conn.close()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerInfo, ServerInfo]]:
    reason = _missing_tools("http")
    if reason:
        pytest.skip(reason)
    a = start_server(tmp_path_factory.mktemp("hutch-ui-a"), config_text=STATS_CONFIG)
    b = start_server(tmp_path_factory.mktemp("hutch-ui-b"), config_text=STATS_CONFIG)
    try:
        yield a, b
    finally:
        for info in (a, b):
            if info.proc.poll() is None:
                os.kill(info.proc.pid, signal.SIGCONT)  # in case the spec stopped and did not resume it
            info.stop()


def _comparable(defs: dict[str, Any]) -> dict[str, Any]:
    """A definitions document without what differs between two nodes by nature (versions, order)."""
    out: dict[str, Any] = {}
    for key, value in defs.items():
        if key in ("rabbit_version", "rabbitmq_version", "product_name", "product_version"):
            continue
        out[key] = sorted((json.dumps(x, sort_keys=True) for x in value), key=str) if isinstance(value, list) else value
    return out


def test_operator_pages_in_chromium(nodes: tuple[ServerInfo, ServerInfo]) -> None:
    a, b = nodes
    _setup(a)
    artifacts = ARTIFACTS / "operator"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    # a client for the connection and channel pages (confirm mode, a consumer, prefetch 10), and traffic
    # beside it so that the charts and rates have something to show
    params = pika.URLParameters(a.url + "?heartbeat=0")
    params.client_properties = {"connection_name": "ui-held"}
    held = pika.BlockingConnection(params)
    held_ch = held.channel()
    held_ch.confirm_delivery()
    held_ch.basic_qos(prefetch_count=10)
    held_ch.basic_consume("ui-dead-letters", lambda c, m, _p, _b: None)
    traffic = Traffic(a.url)
    try:
        env = {**os.environ, "CHROMIUM": CHROMIUM, "NODE_PID": str(a.proc.pid)}
        proc = subprocess.run(["node", str(BROWSER_DIR / "operator.spec.mjs"), a.mgmt_url, b.mgmt_url, str(artifacts)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=SPEC_TIMEOUT_S, env=env)
    finally:
        if a.proc.poll() is None:
            os.kill(a.proc.pid, signal.SIGCONT)
        traffic.stop()
    output = proc.stdout + proc.stderr
    (artifacts / "operator.spec.log").write_text(output)
    print(output)
    assert proc.returncode == 0, f"operator.spec.mjs failed (screenshots in {artifacts}):\n{output}"
    assert "all steps passed" in output
    held.process_data_events(0)  # the held connection outlived the SIGSTOP
    held.close()

    # node B got node A's definitions through the browser's download and upload
    downloaded = json.loads((artifacts / "definitions.json").read_text())
    assert _comparable(downloaded) == _comparable(_call(a, "GET", "/api/definitions"))
    assert _comparable(_call(b, "GET", "/api/definitions")) == _comparable(_call(a, "GET", "/api/definitions"))
    assert any(q["name"] == DLX_QUEUE for q in _call(b, "GET", "/api/definitions")["queues"])

    # limits set in the browser are enforced over AMQP
    limited = pika.URLParameters(f"amqp://{LIMITED_USER}:{LIMITED_PASSWORD}@127.0.0.1:{a.amqp_port}/%2F")
    first = pika.BlockingConnection(limited)
    with pytest.raises(ProbableAccessDeniedError) as refused:  # pika's name for a close during connection.open
        pika.BlockingConnection(limited)
    assert "(530) \"NOT_ALLOWED" in str(refused.value) and "user connection limit (1) is reached" in str(refused.value)
    first.close()
    capped = pika.BlockingConnection(pika.URLParameters(
        f"amqp://guest:guest@127.0.0.1:{a.amqp_port}/{CAPPED_VHOST}"))
    ch = capped.channel()
    ch.queue_declare("capped-1")
    with pytest.raises(ChannelClosedByBroker) as declined:
        ch.queue_declare("capped-2")
    assert declined.value.reply_code == 406
    assert "queue limit" in declined.value.reply_text
    capped.close()
