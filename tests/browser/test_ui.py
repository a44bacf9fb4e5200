"""Browser tests of the management web UI (src/hutch/mgmt/ui/, docs/web-ui.md).

A real hutch-server (collecting statistics every second, so rates show quickly) and a pika publisher
and consumer in threads of this process, while `node ui.spec.mjs` drives headless Debian chromium
through playwright-core: log in, watch the overview charts move, create a queue, publish a message and
get it back from the queue page, create a user and a policy, purge and delete the queue, and render
every other page. Screenshots go to artifacts/browser/.

Skipped, with the reason, when chromium, node or tests/browser/node_modules (`npm ci`) is missing;
`make test` installs them first (`make browser-deps`) where it can.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

BROWSER_DIR = Path(__file__).resolve().parent
ROOT = BROWSER_DIR.parents[1]
ARTIFACTS = ROOT / "artifacts" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SPEC_TIMEOUT_S = 150
LOAD_QUEUE = "ui-load"  # gets messages and keeps them: the queued-messages chart climbs
CONSUMED_QUEUE = "ui-load-consumed"  # consumed and acked: deliver and ack rates are not zero


def _missing_tools() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"no chromium at {CHROMIUM} (Debian package `chromium`; `make browser-deps` installs it as root)"
    if shutil.which("node") is None:
        return "node is not installed (needed to run tests/browser/ui.spec.mjs)"
    if not (BROWSER_DIR / "node_modules" / "playwright-core" / "package.json").is_file():
        return "playwright-core is not installed: run `npm ci` in tests/browser (`make browser-deps`)"
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


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    reason = _missing_tools()
    if reason:
        pytest.skip(reason)
    info = start_server(tmp_path_factory.mktemp("hutch-ui"), config_text="collect_statistics_interval = 1000\n")
    yield info
    info.stop()


def test_web_ui_in_chromium(ui_server: ServerInfo) -> None:
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    traffic = Traffic(ui_server.url)
    started = time.monotonic()
    try:
        proc = subprocess.run(["node", str(BROWSER_DIR / "ui.spec.mjs"), ui_server.mgmt_url, str(ARTIFACTS)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=SPEC_TIMEOUT_S,
                              env={**os.environ, "CHROMIUM": CHROMIUM})
    finally:
        traffic.stop()
    output = proc.stdout + proc.stderr
    (ARTIFACTS / "ui.spec.log").write_text(output)
    print(output)
    print(f"browser run: {time.monotonic() - started:.1f} s, {traffic.published} messages published; "
          f"screenshots in {ARTIFACTS}")
    assert proc.returncode == 0, f"ui.spec.mjs failed (screenshots in {ARTIFACTS}):\n{output}"
    assert "all steps passed" in output
