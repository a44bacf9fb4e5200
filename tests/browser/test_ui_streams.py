"""Browser test of the web UI's stream pages (docs/streams.md, docs/web-ui.md): the Streams list, a stream's
page with its consumers (an AMQP 0-9-1 consumer and a stream-protocol subscription, each with its offset,
lag and credit) and publishers, the stream connections, and closing one from its page.

One hutch-server with its stream listener; a stream "ui-stream" written by pika and by an rstream producer
(connection "ui-producer", publisher reference "ui-ref"); an rstream consumer (connection "ui-consumer")
that reads it all from the first offset, and a pika consumer ("ui-held", prefetch 5) that never
acknowledges. rstream runs on an event loop in a thread of this process while `node streams.spec.mjs`
drives headless Debian chromium through playwright-core, as test_ui.py does. Afterwards the producer's
client must have been told its connection was closed.

Skipped, with the reason, without chromium, node or tests/browser/node_modules (`make browser-deps`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from rstream import AMQPMessage, Consumer, ConsumerOffsetSpecification, MessageContext, OffsetType, Producer
from tests.browser.test_ui import ARTIFACTS, BROWSER_DIR, CHROMIUM, STATS_CONFIG, _missing_tools
from tests.browser.test_ui_operator import _call
from tests.conftest import ServerInfo, start_server
from tests.mgmt.helpers import wait_for

SPEC_TIMEOUT_S = 120
STREAM = "ui-stream"
PIKA_MESSAGES = 12
RSTREAM_MESSAGES = 8
HELD_PREFETCH = 5
AUTH = {"username": "guest", "password": "guest"}


class StreamClients:
    """The rstream producer and consumer, on an event loop of their own in a thread, until stop()."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.ready = threading.Event()
        self.closed: list[Any] = []  # what the producer's on_close_handler was told
        self.consumed: list[int] = []
        self.error: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.stopping: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(30) and self.error is None, f"the rstream clients did not start: {self.error!r}"

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # reported by __init__ or stop()
            self.error = exc
            self.ready.set()

    async def _main(self) -> None:
        self.stopping = asyncio.Event()

        async def on_close(info: Any) -> None:
            self.closed.append(info)

        async def on_message(_msg: AMQPMessage, ctx: MessageContext) -> None:
            self.consumed.append(ctx.offset)

        async with Producer("127.0.0.1", port=self.port, connection_name="ui-producer", on_close_handler=on_close,
                            **AUTH) as producer, \
                Consumer("127.0.0.1", port=self.port, connection_name="ui-consumer", **AUTH) as consumer:
            for i in range(RSTREAM_MESSAGES):
                await producer.send_wait(STREAM, AMQPMessage(body=b"rstream %d" % i), publisher_name="ui-ref")
            await consumer.start()
            await consumer.subscribe(STREAM, on_message,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST))
            self.ready.set()
            await self.stopping.wait()

    def stop(self) -> None:
        if self.stopping is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(30)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    reason = _missing_tools("http")
    if reason:
        pytest.skip(reason)
    info = start_server(tmp_path_factory.mktemp("hutch-ui-streams"), "--stream-port", "0", config_text=STATS_CONFIG)
    try:
        yield info
    finally:
        info.stop()


def test_stream_pages_in_chromium(node: ServerInfo) -> None:
    artifacts = ARTIFACTS / "streams"
    shutil.rmtree(artifacts, ignore_errors=True)
    artifacts.mkdir(parents=True)
    conn = pika.BlockingConnection(pika.URLParameters(node.url + "?heartbeat=0"))
    ch = conn.channel()
    ch.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream", "x-max-age": "7D"})
    ch.confirm_delivery()
    for i in range(PIKA_MESSAGES):
        ch.basic_publish("", STREAM, b"pika %d" % i)
    clients = StreamClients(node.ports["stream"])
    held = conn.channel()
    held.basic_qos(prefetch_count=HELD_PREFETCH)
    delivered: list[int] = []
    held.basic_consume(STREAM, lambda _c, _m, p, _b: delivered.append(p.headers["x-stream-offset"]),
                       arguments={"x-stream-offset": "first"}, consumer_tag="ui-held")
    total = PIKA_MESSAGES + RSTREAM_MESSAGES
    try:
        # every delivery dispatched to the held consumer (pika nacks undispatched ones when it closes, which
        # a stream refuses with 540, as RabbitMQ does), and the rstream consumer has read everything
        assert wait_for(lambda: (conn.process_data_events(0), len(delivered))[1] == HELD_PREFETCH, 30)
        assert wait_for(lambda: len(clients.consumed) == total, 30)
        q = _call(node, "GET", f"/api/queues/%2F/{STREAM}")
        expected = {"stream": STREAM, "node": q["node"], "last": q["last_offset"], "segments": q["segments"],
                    "held_offset": HELD_PREFETCH, "held_lag": q["committed_offset"] + 1 - HELD_PREFETCH}
        env = {**os.environ, "CHROMIUM": CHROMIUM, "EXPECTED": json.dumps(expected)}
        proc = subprocess.run(["node", str(BROWSER_DIR / "streams.spec.mjs"), node.mgmt_url, str(artifacts)],
                              cwd=BROWSER_DIR, capture_output=True, text=True, timeout=SPEC_TIMEOUT_S, env=env)
        output = proc.stdout + proc.stderr
        (artifacts / "streams.spec.log").write_text(output)
        print(output)
        assert proc.returncode == 0, f"streams.spec.mjs failed (screenshots in {artifacts}):\n{output}"
        assert "all steps passed" in output
        assert wait_for(lambda: bool(clients.closed), 10), "the producer's client was not told of the close"
    finally:
        clients.stop()
        conn.close()
    assert clients.error is None, clients.error
