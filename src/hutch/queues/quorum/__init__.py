"""Quorum queues: a replicated FIFO on Raft, modelled on RabbitMQ's rabbit_fifo (docs/quorum-queues.md).

Owns the pure state machine and its parts: `config` (the replicated settings), `commands` (the `make_*`
constructors and the log-entry codec), `messages` (per-message records, the ready FIFO, the live raft
indexes), `consumers` (credit, priorities, single active consumer), `deadletter` (at-most-once and
at-least-once), `effects` (effects and replies as data), `state` (the state, queries, snapshot) and
`machine` (`apply` and the Raft driver adapter `QuorumMachine`). No IO, no asyncio, no clock: the
runtime proposes commands, runs the machine on its Raft driver and turns effects into IO.
"""

from .commands import (
    CommandError,
    decode,
    encode,
    make_cancel,
    make_checkout,
    make_credit,
    make_dequeue,
    make_discard,
    make_dlx_checkout,
    make_dlx_settle,
    make_down,
    make_enqueue,
    make_enqueue_batch,
    make_purge,
    make_register_publisher,
    make_requeue,
    make_return,
    make_settle,
    make_tick,
    make_touch,
    make_unregister_publisher,
    make_update_config,
    payload_of,
    payloads_of,
)
from .config import QuorumConfig
from .effects import (
    DUPLICATE,
    OK,
    REJECTED,
    CheckoutReply,
    Confirm,
    ConsumerStatus,
    DeadLetter,
    DeleteQueue,
    Deliver,
    DequeueReply,
    DlxDeliver,
    DlxWorker,
    Dropped,
    OverflowStatus,
    Reject,
    ReleaseCursor,
)
from .machine import Applied, Meta, QuorumMachine, apply, leader_effects
from .state import QueueState

__all__ = [
    "DUPLICATE", "OK", "REJECTED", "Applied", "CheckoutReply", "CommandError", "Confirm", "ConsumerStatus",
    "DeadLetter", "DeleteQueue", "Deliver", "DequeueReply", "DlxDeliver", "DlxWorker", "Dropped", "Meta",
    "OverflowStatus", "QueueState", "QuorumConfig", "QuorumMachine", "Reject", "ReleaseCursor", "apply",
    "decode", "encode", "leader_effects", "make_cancel", "make_checkout", "make_credit", "make_dequeue",
    "make_discard", "make_dlx_checkout", "make_dlx_settle", "make_down", "make_enqueue", "make_enqueue_batch",
    "make_purge",
    "make_register_publisher", "make_requeue", "make_return", "make_settle", "make_tick", "make_touch",
    "make_unregister_publisher", "make_update_config", "payload_of", "payloads_of",
]
