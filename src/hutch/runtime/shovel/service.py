"""The node's dynamic shovels: one `ShovelWorker` per `shovel` runtime parameter this node runs.

Owns: `ShovelService` (watches the node's `ParameterStore`, starts, replaces and stops workers, restarts
one on request, clears the parameter of a shovel that has finished its `src-delete-after`, answers
status for `GET /api/shovels`), and the placement rule `runs_here`.

Rules:
- A shovel runs on exactly one node of a cluster: the metadata group's leader (on a node that is not
  clustered, the node itself). When leadership moves (its node went), the new leader's service starts
  every shovel and the old one's, if it still runs, stops them (`placement_changed`).
- Changing a shovel's parameter restarts it with the new definition; clearing it stops it. A
  `src-delete-after` count is of the current definition: a new definition starts counting again.
- Starting and stopping workers are tasks of their own (a link's close awaits the peer); the watcher
  callback itself never awaits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from hutch.core.shovel import COMPONENT, parse_shovel
from hutch.runtime.broker import parameters
from hutch.runtime.broker.parameters import Key, Parameter, ParameterStore
from hutch.runtime.ports import BrokerPort
from hutch.runtime.shovel.client import AmqpLink
from hutch.runtime.shovel.pipe import open_local
from hutch.runtime.shovel.worker import ShovelWorker

log = logging.getLogger("hutch.shovel")


class ShovelService:
    """`start()` after the node's definitions are restored; `stop()` before the listeners close."""

    def __init__(self, node: BrokerPort, store: ParameterStore, clear: Callable[[str, str, str], object],
                 runs_here: Callable[[], bool] = lambda: True) -> None:
        self.node = node
        self.store = store
        self.clear = clear  # (component, vhost, name): clear a parameter (recorded) when its shovel is done
        self.runs_here = runs_here
        self.workers: dict[tuple[str, str], ShovelWorker] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False

    async def start(self) -> None:
        self._started = True
        self.store.watchers.append(self._changed)
        self.placement_changed()

    async def stop(self) -> None:
        self._started = False
        if self._changed in self.store.watchers:
            self.store.watchers.remove(self._changed)
        workers, self.workers = list(self.workers.values()), {}
        await asyncio.gather(*(w.stop() for w in workers))
        for task in list(self._tasks):
            task.cancel()

    # -- what runs ----------------------------------------------------------------------------------
    def placement_changed(self) -> None:
        """Start every shovel if this node is where they run now, or stop them all if it is not."""
        if not self._started:
            return
        if self.runs_here():
            for p in self.store.list(COMPONENT):
                if (p.vhost, p.name) not in self.workers:
                    self._launch(p)
        else:
            for key in list(self.workers):
                self._retire(key)

    def _changed(self, p: Parameter | None, key: Key) -> None:
        component, vhost, name = key
        if component != COMPONENT or not self._started:
            return
        self._retire((vhost, name))
        if p is not None and self.runs_here():
            self._launch(p)

    def _launch(self, p: Parameter) -> None:
        try:
            d = parse_shovel(p.name, p.value)
        except ValueError as exc:  # validated when set; a stored one this version refuses is logged
            log.warning("shovel '%s' in vhost '%s' not started: %s", p.name, p.vhost, exc)
            return
        worker = ShovelWorker(d, p.vhost, p.user or self.node.config.default_user, self.node.config.node_name,
                              self._open_local, self._done)
        self.workers[(p.vhost, p.name)] = worker
        worker.start()

    def _retire(self, key: tuple[str, str]) -> None:
        worker = self.workers.pop(key, None)
        if worker is not None:
            self._spawn(worker.stop())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _open_local(self, user: str, vhost: str, name: str) -> AmqpLink:
        return await open_local(self.node, user, vhost, name)

    def _done(self, worker: ShovelWorker) -> None:
        """`src-delete-after` reached: the shovel removes itself (its parameter is cleared, recorded)."""
        log.info("shovel '%s' in vhost '%s' finished (src-delete-after): removing it", worker.d.name, worker.vhost)
        if self.workers.get((worker.vhost, worker.d.name)) is worker:
            del self.workers[(worker.vhost, worker.d.name)]
            self.clear(COMPONENT, worker.vhost, worker.d.name)

    # -- status -------------------------------------------------------------------------------------
    def status(self, vhost: str | None = None) -> list[dict[str, Any]]:
        return [w.status() for (v, _), w in sorted(self.workers.items()) if vhost is None or v == vhost]

    def restart(self, vhost: str, name: str) -> bool:
        """Stop and start one shovel again (DELETE /api/shovels/vhost/{vhost}/{name}/restart)."""
        p = self.store.get(COMPONENT, vhost, name)
        if p is None or (vhost, name) not in self.workers:
            return False
        self._retire((vhost, name))
        self._launch(p)
        return True


def service_for(node: Any) -> ShovelService:
    """The service of a `Node` (its parameter store, and clearing a finished shovel's parameter)."""
    return ShovelService(node, node.parameters,
                         lambda c, v, n: parameters.clear_parameter(node, c, v, n))


__all__ = ["ShovelService", "service_for"]
