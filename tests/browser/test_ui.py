"""Browser tests of the management web UI (src/hutch/mgmt/ui/, docs/web-ui.md).

A real hutch-server (collecting statistics every second, so rates show quickly) and a pika publisher
and consumer in threads of this process, while `node ui.spec.mjs` drives headless Debian chromium
through playwright-core: log in, watch the overview charts move, create a queue, publish a message and
get it back from the queue page, create a user and a policy, purge and delete the queue, and render
every other page; every state-changing call must carry the page's own Origin. Screenshots go to
artifacts/browser/<scheme>/.

The whole run is done twice: over plain HTTP (`management.tcp`) and over HTTPS (`management.ssl.*`, a
test CA and server certificate made by tests/tls/pki.py). Chromium trusts that CA through an NSS database
in a home directory of its own (certutil, Debian's libnss3-tools), not by ignoring certificate errors;
the https run first checks that a Chromium without it refuses the server.

Skipped, with the reason, when chromium, node, tests/browser/node_modules (`npm ci`) or, for https,
certutil is missing; `make test` installs them first (`make browser-deps`) where it can.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pytest
from tests.conftest import ServerInfo, start_server
from tests.tls.conftest import start_tls_node

BROWSER_DIR = Path(__file__).resolve().parent
ROOT = BROWSER_DIR.parents[1]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SPEC_TIMEOUT_S = 150
LOAD_QUEUE = "ui-load"  # gets messages and keeps them: the queued-messages chart climbs
CONSUMED_QUEUE = "ui-load-consumed"  # consumed and acked: deliver and ack rates are not zero
STATS_CONFIG = "collect_statistics_interval = 1000\n"


def _missing_tools(scheme: str) -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"no chromium at {CHROMIUM} (Debian package `chromium`; `make browser-deps` installs it as root)"
    if shutil.which("node") is None:
        return "node is not installed (needed to run tests/browser/ui.spec.mjs)"
    if not (BROWSER_DIR / "node_modules" / "playwright-core" / "package.json").is_file():
        return "playwright-core is not installed: run `npm ci` in tests/browser (`make browser-deps`)"
    if scheme == "https" and shutil.which("certutil") is None:
        return ("no certutil to make Chromium trust the test CA (Debian package `libnss3-tools`; "
                "`make browser-deps` installs it as root)")
    return None


class Traffic:
    """A publisher (about 100 messages/s over two queues) and a consumer of one of them, each on its
    own pika connection in a thread, until stop()."""

    def __init__(self, url: str) -> None:
        self.params = pika.URLParameters(url)
        self.stopping = threading.Event()
        self.published = 0
        self.errors: list[BaseException] = []
        setup = pika.BlockingConnection(self.params)
        ch = setup.channel()
        ch.queue_declare(LOAD_QUEUE, arguments={"x-max-length": 50_000})
        ch.queue_declare(CONSUMED_QUEUE)
        setup.close()
        self.threads = [threading.Thread(target=self._guard, args=(fn,), daemon=True)
                        for fn in (self._publish, self._consume)]
        for t in self.threads:
            t.start()

    def _guard(self, fn) -> None:  # type: ignore[no-untyped-def]
        try:
            fn()
        except BaseException as exc:  # reported by stop(): a dead publisher would make the charts flat
            self.errors.append(exc)

    def _publish(self) -> None:
        conn = pika.BlockingConnection(self.params)
        ch = conn.channel()
        n = 0
        while not self.stopping.is_set():
            ch.basic_publish("", LOAD_QUEUE if n % 2 else CONSUMED_QUEUE, b"load %d" % n)
            n += 1
            self.published = n
            conn.process_data_events(time_limit=0.01)
        conn.close()

    def _consume(self) -> None:
        conn = pika.BlockingConnection(self.params)
        ch = conn.channel()
        ch.basic_qos(prefetch_count=50)
        ch.basic_consume(CONSUMED_QUEUE, lambda c, m, _p, _b: c.basic_ack(m.delivery_tag))
        while not self.stopping.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(10)
        if self.errors:
            raise AssertionError(f"the test traffic failed: {self.errors[0]!r}")


@dataclass
class UiTarget:
    """A node and the address the browser opens: its plain HTTP listener, or its HTTPS listener at
    https://localhost:PORT with the CA (`cacertfile`) that issued its certificate; a node with HTTPS
    also has an AMQPS listener (`amqps_port`), whose connection page shows its TLS details."""

    info: ServerInfo
    base_url: str
    cacertfile: Path | None = None
    amqps_port: int | None = None
    client_cert: tuple[Path, Path] | None = None  # (certificate, key) the AMQPS client presents

    def tls_client(self) -> pika.BlockingConnection | None:
        """A pika connection over TLS named "ui-tls", with a client certificate (CN=ui-tls), when there is
        AMQPS: the spec looks at its page."""
        if self.amqps_port is None or self.cacertfile is None:
            return None
        ctx = ssl.create_default_context(cafile=str(self.cacertfile))
        if self.client_cert is not None:
            ctx.load_cert_chain(str(self.client_cert[0]), str(self.client_cert[1]))
        return pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", self.amqps_port, ssl_options=pika.SSLOptions(ctx, "localhost"), heartbeat=0,
            client_properties={"connection_name": "ui-tls"}))


# the HTTPS run is in `make test-slow` (17 s; the UI over TLS): `make test` keeps the plain HTTP one
@pytest.fixture(scope="module", params=["http", pytest.param("https", marks=pytest.mark.slow)])
def ui_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiTarget]:
    scheme: str = request.param
    reason = _missing_tools(scheme)
    if reason:
        pytest.skip(reason)
    tmp = tmp_path_factory.mktemp(f"hutch-ui-{scheme}")
    if scheme == "https":
        node = start_tls_node(tmp, STATS_CONFIG)
        target = UiTarget(node.info, node.https_url, node.pki.cacertfile, node.amqps_port, node.pki.issue("ui-tls"))
    else:
        info = start_server(tmp, config_text=STATS_CONFIG)
        target = UiTarget(info, info.mgmt_url)
    yield target
    target.info.stop()


def test_web_ui_in_chromium(ui_server: UiTarget) -> None:
    artifacts = ARTIFACTS / ui_server.base_url.split(":", 1)[0]
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    env = {**os.environ, "CHROMIUM": CHROMIUM}
    if ui_server.cacertfile is not None:
        env["CA_CERT"] = str(ui_server.cacertfile)
    traffic = Traffic(ui_server.info.url)
    tls_client = ui_server.tls_client()
    started = time.monotonic()
    try:
        proc = subprocess.run(["node", str(BROWSER_DIR / "ui.spec.mjs"), ui_server.base_url, str(artifacts)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=SPEC_TIMEOUT_S, env=env)
    finally:
        traffic.stop()
        if tls_client is not None:
            tls_client.close()
    output = proc.stdout + proc.stderr
    (artifacts / "ui.spec.log").write_text(output)
    print(output)
    print(f"browser run on {ui_server.base_url}: {time.monotonic() - started:.1f} s, {traffic.published} "
          f"messages published; screenshots in {artifacts}")
    assert proc.returncode == 0, f"ui.spec.mjs failed (screenshots in {artifacts}):\n{output}"
    assert "all steps passed" in output
    assert f"all with Origin {ui_server.base_url}" in output
