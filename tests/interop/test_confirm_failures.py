"""Publisher confirms and transactions when message storage fails, with pika against an in-process node
whose file system fails fdatasync on demand (storage/memfs.FaultyFS over the real file system).

The group commit rejects the receipts it holds (core/confirms.py): a confirming publisher gets
basic.nack for the persistent message, in publish order after the acks before it; a transaction that
waits for the sync loses its connection with 541 INTERNAL_ERROR. Transient messages do not wait for the
disk and are still acked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pika
import pika.exceptions
import pytest

from hutch.core.auth import AuthStore
from hutch.runtime.app import build_node, start_node
from hutch.runtime.broker.node import Node
from hutch.runtime.queue_types.classic.persistence import Persistence
from hutch.storage.fs import RealFS
from hutch.storage.memfs import FaultyFS

from .inproc import InProcNode

PERSISTENT = pika.BasicProperties(delivery_mode=2)


class FaultyStorageNode(InProcNode):
    """An in-process node with message storage on a FaultyFS."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(monitor_resources=False, data_dir=str(data_dir))
        self.fs = FaultyFS(RealFS())

    def start(self) -> FaultyStorageNode:
        self._thread.start()

        async def boot() -> Node:
            auth = AuthStore(scrypt_n=16)
            auth.bootstrap(self.config.default_user, self.config.default_pass, self.config.default_vhost)
            node = build_node(self.config, auth=auth, monitor_resources=False,
                              persistence=Persistence(self.config.data_dir, fs=self.fs))
            self.server = await start_node(node)
            return node

        self.node = asyncio.run_coroutine_threadsafe(boot(), self.loop).result(10)
        return self


def _connect(node: InProcNode) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", node.amqp_port))


def test_a_storage_failure_nacks_waiting_confirms_and_fails_a_waiting_commit(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with FaultyStorageNode(tmp_path) as node:
        conn = _connect(node)
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("d", durable=True)
        ch.basic_publish("", "d", b"before", PERSISTENT)  # acked once synced: storage works
        node.fs.fail_next_syncs = 1
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", "d", b"lost", PERSISTENT)
        with pytest.raises(pika.exceptions.NackError):  # storage stays failed: never durable now
            ch.basic_publish("", "d", b"after", PERSISTENT)
        ch.basic_publish("", "d", b"transient")  # waits for no disk: still acked

        tx = conn.channel()
        tx.tx_select()
        tx.basic_publish("", "d", b"in a tx", pika.BasicProperties(delivery_mode=1))
        tx.tx_commit()  # transient only: committed
        tx.basic_publish("", "d", b"in a tx", PERSISTENT)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            tx.tx_commit()
        assert closed.value.reply_code == 541
        assert "message storage failed" in closed.value.reply_text
        node.call(lambda: None)  # the loop has run what the close left behind
        # the close happens while the connection answers its channels (no error in the loop's callbacks)
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
