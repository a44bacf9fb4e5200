"""A hutch node running inside the test process, on an asyncio loop in a background thread.

The access-control tests need to create users and set permissions, and there is no management API
or user-seeding config to do that on a separate `hutch-server` process; here the test reaches the
node's `AuthStore` directly. Every call into the node runs on the node's loop thread (`call`), as
the runtime's single-threaded rules require. Clients connect to `amqp_port` like to a real server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from hutch.config import Config
from hutch.core.auth import AuthStore
from hutch.runtime.app import build_node, start_node, stop_node
from hutch.runtime.broker.node import Node

T = TypeVar("T")


class InProcNode:
    def __init__(self, monitor_resources: bool = True, **config: Any) -> None:
        self.monitor_resources = monitor_resources
        config.setdefault("amqp_host", "127.0.0.1")
        config.setdefault("amqp_port", 0)
        config.setdefault("management_port", 0)
        config.setdefault("node_name", "inproc@localhost")
        self.config = Config(**config)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="hutch-inproc", daemon=True)
        self.node: Node | None = None
        self.server: asyncio.base_events.Server | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> InProcNode:
        self._thread.start()

        async def boot() -> Node:
            # a cheap scrypt cost: these tests log in many times; the hashing itself is unit-tested
            auth = AuthStore(scrypt_n=16)
            auth.bootstrap(self.config.default_user, self.config.default_pass, self.config.default_vhost)
            node = build_node(self.config, auth=auth, monitor_resources=self.monitor_resources)
            self.server = await start_node(node)
            return node

        self.node = asyncio.run_coroutine_threadsafe(boot(), self.loop).result(10)
        return self

    def stop(self) -> None:
        if self.node is not None:
            asyncio.run_coroutine_threadsafe(stop_node(self.node, self.server), self.loop).result(10)
            if self.server is not None:
                asyncio.run_coroutine_threadsafe(self.server.wait_closed(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> InProcNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- calling into the node ---------------------------------------------------------------------
    @property
    def amqp_port(self) -> int:
        assert self.node is not None
        return self.node.amqp_port

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` on the node's loop thread and return its result."""

        async def run() -> T:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def add_user(self, name: str, password: str, vhost: str = "/", configure: str = ".*", write: str = ".*",
                 read: str = ".*", tags: tuple[str, ...] = ()) -> None:
        def add() -> None:
            assert self.node is not None
            auth = self.node.auth
            if auth.get_user(name) is None:
                auth.add_user(name, password, tags=tags)
            auth.set_permissions(name, vhost, configure, write, read)
            self.node.permissions_changed()

        self.call(add)

    def set_permissions(self, user: str, vhost: str = "/", configure: str = ".*", write: str = ".*",
                        read: str = ".*") -> None:
        def update() -> None:
            assert self.node is not None
            self.node.auth.set_permissions(user, vhost, configure, write, read)
            self.node.permissions_changed()

        self.call(update)

    def add_vhost(self, name: str) -> None:
        self.call(lambda: self.node.add_vhost(name))  # type: ignore[union-attr]
