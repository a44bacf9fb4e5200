"""A module's node handed to each test in a fresh node's state (`CleanNode`), instead of a node per test.

Owns the reset between tests: a test that only needs what a fresh node *defines* (no user but guest, no
vhost but "/", no queue, exchange, policy, parameter, limit or topic permission of its own, no connection
open) gets the module's node after `CleanNode.reset` put it back in that state through the HTTP API, and
checked it: the node's definitions (GET /api/definitions) must equal those it had when it started, with no
connection and no alarm left; otherwise (a state the reset does not undo, or a node that exited) the node is
stopped and a new one started, so a test never sees another's leftovers. A node start costs about 0.6-1 s
of CPU; the reset a few HTTP calls. Tests that need more than the definitions of a fresh node (its log, its
data directory, statistics or totals counted from zero, a special config, a restart) keep a node of their
own (`fresh_server`, tests/conftest.py). docs/testing.md, "Where the time goes".
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from conftest import ServerInfo, start_server  # tests/conftest.py (tests/ is on sys.path)

from .helpers import Api, seg, wait_mgmt

_RESET_WAIT_S = 10.0
"""How long the reset waits for closed connections and deleted objects to be gone before it gives up and
starts a new node instead."""


class CleanNode:
    """A node started in `tmp` (lazily, again whenever the reset cannot bring it back to a fresh node's
    definitions) and reset before each test that asks for it."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._starts = 0
        self._info: ServerInfo | None = None
        self._baseline: dict[str, Any] = {}
        self._cluster_name: Any = None

    def _start(self) -> ServerInfo:
        self._starts += 1
        info = wait_mgmt(start_server(self._tmp / f"node{self._starts}"))
        api = Api(info.mgmt_url)
        self._baseline = api.ok("/api/definitions")
        self._cluster_name = api.ok("/api/cluster-name")
        self._info = info
        return info

    def clean(self) -> ServerInfo:
        """The node, in a fresh node's state (a new node if the reset could not get it there)."""
        info = self._info
        if info is None:
            return self._start()
        if info.proc.poll() is None:
            try:
                if self._reset(Api(info.mgmt_url)):
                    return info
            except (OSError, AssertionError, ValueError):  # the node did not answer as a fresh one would
                pass
        info.stop()
        return self._start()

    def stop(self) -> None:
        if self._info is not None:
            self._info.stop()

    def __enter__(self) -> CleanNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _reset(self, api: Api) -> bool:
        for conn in api.ok("/api/connections"):
            api.delete(f"/api/connections/{seg(conn['name'])}")
        for vhost in api.ok("/api/vhosts"):
            if vhost["name"] != "/":
                api.delete(f"/api/vhosts/{seg(vhost['name'])}")
        for user in api.ok("/api/users"):
            if user["name"] != "guest":
                api.delete(f"/api/users/{seg(user['name'])}")
        for kind in ("policies", "operator-policies"):
            for policy in api.ok(f"/api/{kind}"):
                api.delete(f"/api/{kind}/{seg(policy['vhost'])}/{seg(policy['name'])}")
        defined = api.ok("/api/definitions")
        for param in defined["parameters"]:
            api.delete(f"/api/parameters/{seg(param['component'])}/{seg(param['vhost'])}/{seg(param['name'])}")
        for param in defined["global_parameters"]:
            api.delete(f"/api/global-parameters/{seg(param['name'])}")
        for limits in api.ok("/api/vhost-limits"):
            for name in limits["value"]:
                api.delete(f"/api/vhost-limits/{seg(limits['vhost'])}/{seg(name)}")
        for limits in api.ok("/api/user-limits"):
            api.delete(f"/api/user-limits/{seg(limits['user'])}/all")
        for perm in defined["topic_permissions"]:
            api.delete(f"/api/topic-permissions/{seg(perm['vhost'])}/{seg(perm['user'])}")
        for queue in api.ok("/api/queues"):
            api.delete(f"/api/queues/{seg(queue['vhost'])}/{seg(queue['name'])}")
        for exchange in api.ok("/api/exchanges"):
            if exchange["name"] and not exchange["name"].startswith("amq."):
                api.delete(f"/api/exchanges/{seg(exchange['vhost'])}/{seg(exchange['name'])}")
        for binding in api.ok("/api/bindings"):  # left between the default amq.* exchanges
            if binding["source"] and binding["destination_type"] == "exchange":
                api.delete(f"/api/bindings/{seg(binding['vhost'])}/e/{seg(binding['source'])}/e/"
                           f"{seg(binding['destination'])}/{seg(binding['properties_key'])}")
        for perm in self._baseline["permissions"]:
            api.put(f"/api/permissions/{seg(perm['vhost'])}/{seg(perm['user'])}",
                    {k: perm[k] for k in ("configure", "write", "read")})
        now = {v["name"]: v for v in api.ok("/api/definitions")["vhosts"]}
        for vhost in self._baseline["vhosts"]:  # "/" as a fresh node has it (an import may redefine it)
            if now.get(vhost["name"]) != vhost:
                api.put(f"/api/vhosts/{seg(vhost['name'])}", dict(vhost["metadata"]))
        if api.ok("/api/cluster-name") != self._cluster_name:
            api.put("/api/cluster-name", self._cluster_name)
        deadline = time.monotonic() + _RESET_WAIT_S
        while time.monotonic() < deadline:
            if self._is_fresh(api):
                return True
            time.sleep(0.02)
        return False

    def _is_fresh(self, api: Api) -> bool:
        if api.ok("/api/connections") or api.ok("/api/definitions") != self._baseline:
            return False
        return not any(node.get("mem_alarm") or node.get("disk_free_alarm") for node in api.ok("/api/nodes"))
