"""Helpers of the management suite: `Api`, a tiny urllib client of the HTTP API returning
(status, headers, decoded JSON); `run_ctl`, which runs `python -m hutch.cli.ctl` against a node;
`wait_mgmt`, unique names, a pika `connect` and a polling `wait_for`. Every wait has a deadline.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pika

from conftest import ServerInfo  # tests/conftest.py (tests/ is on sys.path)

_counter = itertools.count(1)


def unique(prefix: str = "q") -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{time.monotonic_ns() % 1_000_000}"


def seg(value: str) -> str:
    return quote(value, safe="")


def wait_mgmt(info: ServerInfo, timeout: float = 10.0) -> ServerInfo:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", info.management_port), timeout=0.5):
                return info
        except OSError:
            if info.proc.poll() is not None:
                raise RuntimeError(f"hutch-server exited:\n{info.log()}") from None
            time.sleep(0.05)
    raise RuntimeError(f"management port {info.management_port} not listening:\n{info.log()}")


@dataclass
class Reply:
    status: int
    headers: Any
    body: Any


@dataclass
class Api:
    base: str
    user: str = "guest"
    password: str = "guest"

    def as_user(self, user: str, password: str) -> Api:
        return Api(self.base, user, password)

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
             auth: bool = True, raw: bytes | None = None) -> Reply:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, hdrs, payload = resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as exc:
            status, hdrs, payload = exc.code, exc.headers, exc.read()
        return Reply(status, hdrs, json.loads(payload) if payload.strip() else None)

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.call("GET", path, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> Reply:
        return self.call("PUT", path, body if body is not None else {}, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Reply:
        return self.call("DELETE", path, **kwargs)

    def ok(self, path: str) -> Any:
        reply = self.get(path)
        assert reply.status == 200, (path, reply.status, reply.body)
        return reply.body


def connect(port: int, user: str = "guest", password: str = "guest", vhost: str = "/") -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", port, vhost, pika.PlainCredentials(user, password), connection_attempts=1,
        socket_timeout=5, blocked_connection_timeout=30))


def wait_for(predicate: Any, timeout: float = 5.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def run_ctl(info: ServerInfo | None, *args: str, env: dict[str, str] | None = None,
            port: int | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith("HUTCH_") or k == "HUTCH_PURE"}  # HUTCH_PURE: the pure hot path
    full_env["HUTCH_MANAGEMENT_PORT"] = str(port if port is not None else info.management_port)  # type: ignore[union-attr]
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "hutch.cli.ctl", *args], capture_output=True, text=True,
                          env=full_env, timeout=30)


class StallProbe:
    """A second client doing AMQP round trips (a passive `queue.declare`) every 20 ms in a thread: the
    longest one is how long the event loop stalled while the test ran (issue 21's measure).
    Use as a context manager; `longest_s` and `rounds` are read after it exits."""

    def __init__(self, port: int, vhost: str = "/",
                 interval_s: float = 0.02) -> None:
        self.conn = connect(port, vhost=vhost)
        self.channel = self.conn.channel()
        self.queue = unique("probe")
        self.channel.queue_declare(self.queue, exclusive=True)
        self.interval_s = interval_s
        self.longest_s = 0.0
        self.rounds = 0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            self.channel.queue_declare(self.queue, passive=True)
            self.longest_s = max(self.longest_s, time.monotonic() - started)
            self.rounds += 1
            time.sleep(self.interval_s)

    def start(self) -> StallProbe:
        self._thread.start()
        time.sleep(0.1)
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(120)
        self.conn.close()

    def __enter__(self) -> StallProbe:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
