"""A Spark driver killed with SIGKILL in the middle of a micro-batch (driver JVM, Python workers and
the source's AMQP connection all die at once), restarted from its checkpoint, still sees every message.
Slow: two Spark start-ups in separate processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import ServerInfo

from .helpers import Broker, amqp_uri, unique, wait_for

DRIVER = Path(__file__).with_name("crash_driver.py")


def _kill_mid_batch_then_restart(server: ServerInfo, name: str, kind: str, tmp_path: Path) -> Counter[str]:
    """Run crash_driver.py, SIGKILL its process group in the middle of batch 2, run it again from the
    checkpoint with Trigger.AvailableNow; the bodies the sink wrote, counted."""
    out, ck = tmp_path / "out", tmp_path / "ck"
    out.mkdir()
    args = [sys.executable, str(DRIVER), amqp_uri(server.amqp_port), name, str(out), str(ck)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen([*args, "first", kind, str(server.ports.get("stream", 0))], start_new_session=True, env=env,
                                 stdout=subprocess.DEVNULL, stderr=log)
        try:
            assert wait_for((out / "inflight-2").exists, 180), (tmp_path / "first.log").read_text()[-3000:]
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(30)
    with open(tmp_path / "restart.log", "wb") as log:
        restart = subprocess.run([*args, "restart", kind, str(server.ports.get("stream", 0))], env=env, stdout=subprocess.DEVNULL, stderr=log,
                                 timeout=300)
    assert restart.returncode == 0, (tmp_path / "restart.log").read_text()[-3000:]
    return Counter(line for f in out.glob("batch-*.txt") for line in f.read_text().splitlines())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_driver_killed_mid_batch_then_restarted_loses_nothing(server: ServerInfo, broker: Broker,
                                                              tmp_path: Path, record_property: Any) -> None:
    q = broker.declare()
    bodies = broker.publish(q, 1500)
    seen = _kill_mid_batch_then_restart(server, q, "queue", tmp_path)
    duplicates = sum(c - 1 for c in seen.values())
    lost = set(bodies) - set(seen)
    record_property("driver_killed_duplicates", duplicates)
    print(f"\ndriver killed mid-batch: {len(bodies)} published, {sum(seen.values())} rows written, "
          f"{duplicates} duplicates, {len(lost)} lost")
    assert not lost
    assert broker.ready(q) == 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_driver_killed_mid_batch_reading_a_stream_then_restarted_reads_exactly_once(
        server: ServerInfo, broker: Broker, tmp_path: Path) -> None:
    name = broker.declare(unique("st"), arguments={"x-queue-type": "stream"})
    bodies = broker.publish(name, 1500)
    seen = _kill_mid_batch_then_restart(server, name, "stream", tmp_path)
    print(f"\nstream, driver killed mid-batch: {len(bodies)} published, {sum(seen.values())} rows written")
    assert seen == Counter(bodies)  # every message exactly once
