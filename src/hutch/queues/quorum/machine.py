"""The quorum queue state machine: `apply(meta, command, state) -> Applied(state, reply, effects)`.

Owns: the transition function (one handler per command), the delivery loop, expiry, length limits,
the release cursor, `leader_effects` (what a new leader re-issues) and `QuorumMachine`, the adapter to
the Raft driver's `StateMachine` protocol (runtime/clustering/raft_group.py). Modelled on RabbitMQ's rabbit_fifo.

Rules:
- Pure and deterministic: no IO, no clock, no randomness. Time is `meta.system_time_ms`, the leader's
  clock stamped into the entry (a Tick's own `now_ms` for a tick); every replica applying the same
  entries computes the same state, replies and effects. `apply` mutates `state` in place and returns it
  (copying a queue per command would cost O(n)).
- After every command, in this order: deliver to consumers (`_checkout`), expire the heads of the ready
  queues, enforce drop-head limits, hand dead letters to the worker, announce reject-publish overflow
  changes, announce the release cursor when it moved by `release_step`.
- Delivery: returns first, then the two priority FIFOs (message priority above 4 is high, RabbitMQ
  4.0): high first, but every third message taken is the older of the two heads (`_pop_ready`); to
  the highest-priority consumer with credit, round robin within a priority (consumers.py). Expired
  messages met on the way are dead-lettered, except a message
  enqueued by this very command: a TTL-0 message is delivered if a consumer can take it now, else it
  expires right after (RabbitMQ's documented TTL 0 behaviour).
- Expiry (`expires_at` = time of the enqueue + the smaller of the queue's and the message's TTL,
  computed here so that every replica uses the leader's stamp and the queue TTL in force at that point
  of the log) is checked at the heads only, as RabbitMQ does.
- Failed deliveries (return, requeue, a consumer lost with the message unacked) increment the delivery
  count; past `delivery_limit` the message is dead-lettered `delivery_limit`. With a delivery limit a
  returned message goes to the front (returns); without one to the back (seed 000).
- reject-publish: an enqueue that would take ready + dlx messages past max-length, or their bytes past
  max-length-bytes, is refused (`Reject`); the limit is thus never overshot (RabbitMQ overshoots by the
  publishes in flight when it tells the channels). drop-head: after delivery, the oldest ready
  messages go (`maxlen`) until the queue fits.
- Deduplication: an enqueue whose seq is not above its publisher's last applied seq is a resend: it
  is confirmed again (or refused again, if it was refused) and not enqueued.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from . import deadletter as dl
from .commands import (
    Cancel,
    Checkout,
    Command,
    Credit,
    Dequeue,
    Discard,
    DlxCheckout,
    DlxSettle,
    Down,
    Enqueue,
    EnqueueBatch,
    Purge,
    RegisterPublisher,
    Requeue,
    Return,
    Settle,
    Tick,
    Touch,
    UnregisterPublisher,
    UpdateConfig,
    decode,
)
from .config import QuorumConfig
from .consumers import Consumer, Status
from .effects import (
    DUPLICATE,
    OK,
    REASON_CODES,
    REASONS,
    REJECTED,
    CheckoutReply,
    DeleteQueue,
    Deliver,
    DequeueReply,
    DlxDeliver,
    DlxWorker,
    Effect,
    Out,
    OverflowStatus,
    ReleaseCursor,
)
from .messages import SHIFT, Record
from .state import (
    HIGH_PRIORITY_ABOVE,
    PRIORITY_WEIGHT,
    PUBLISHER_IDLE_MS,
    RELEASE_CURSOR_STEP,
    Publisher,
    QueueState,
)

_REJECTED = REASON_CODES["rejected"]
_EXPIRED = REASON_CODES["expired"]
_MAXLEN = REASON_CODES["maxlen"]
_DELIVERY_LIMIT = REASON_CODES["delivery_limit"]


class Meta(NamedTuple):
    index: int  # type: ignore[assignment]  # the raft index; shadows tuple.index, never called on a Meta
    term: int
    system_time_ms: int  # the leader's clock, stamped into the entry


class Applied(NamedTuple):
    state: QueueState
    reply: Any
    effects: list[Effect]


def apply(meta: Meta, command: Command, state: QueueState) -> Applied:
    """Apply one committed command. Deterministic; mutates and returns `state`."""
    out = Out()
    if type(command) is Tick:
        meta = meta._replace(system_time_ms=command.now_ms)
    state.last_index = meta.index
    if state.last_active_ms is None:
        state.last_active_ms = meta.system_time_ms
    reply = _HANDLERS[type(command)](meta, command, state, out)
    _after(meta, state, out)
    return Applied(state, reply, out.finish())


# -- messages in ----------------------------------------------------------------------------------------
def _publisher(meta: Meta, st: QueueState, pid: Any) -> Publisher | None:
    """The dedup record of a tracked publisher (made on its first enqueue), seen now; None: untracked."""
    if pid is None:
        return None
    pub = st.publishers.get(pid)
    if pub is None:
        pub = st.publishers[pid] = Publisher()
    pub.last_seen_ms = meta.system_time_ms
    return pub


def _enqueue(meta: Meta, cmd: Enqueue, st: QueueState, out: Out) -> str:
    idx = meta.index << SHIFT
    out.fresh = idx
    pid = cmd.publisher_id
    return _enqueue_one(meta, st, out, pid, _publisher(meta, st, pid), cmd.seq, cmd.size_bytes, cmd.ttl_ms, idx,
                        cmd.priority > HIGH_PRIORITY_ABOVE)


PLAIN_BATCHES = True  # the one-step path for plain batches (False: the per-message loop; tests compare)


def _enqueue_batch(meta: Meta, cmd: EnqueueBatch, st: QueueState, out: Out) -> int:
    """Each message as its own Enqueue would be, in seq order; the reply is how many were enqueued."""
    base = meta.index << SHIFT
    out.fresh = base
    pid = cmd.publisher_id
    pub = _publisher(meta, st, pid)
    seq = cmd.first_seq
    ttls = cmd.ttls
    prios = cmd.priorities
    cfg = st.config
    sizes = cmd.sizes
    if (PLAIN_BATCHES and sizes and ttls is None and prios is None and cfg.message_ttl_ms is None
            and cfg.overflow != "reject-publish" and (pub is None or seq == pub.last_seq + 1)):
        # the common batch: new seqs in order, nothing to expire, to reject or to rank; the same state
        # and effects as the loop below (tests/unit/test_quorum_properties.py checks it against the loop)
        n = len(sizes)
        st.messages.extend(base, sizes)
        st.ready_bytes += sum(sizes)
        st.live.add(base, n)
        if pub is not None:
            pub.last_seq = seq + n - 1
            out.confirms.setdefault(pid, []).extend(range(seq, seq + n))
        return n
    # reject-publish counts ready messages: deliver between the messages, as separate enqueues would
    interleave = cfg.has_limits and cfg.overflow == "reject-publish"
    enqueued = 0
    for pos, size in enumerate(sizes):
        if _enqueue_one(meta, st, out, pid, pub, seq + pos if pub is not None else 0, size,
                        None if ttls is None else ttls[pos], base | pos,
                        prios is not None and prios[pos] > HIGH_PRIORITY_ABOVE) is OK:
            enqueued += 1
            if interleave and st.consumers.prios:
                _checkout(meta, st, out)
    return enqueued


def _enqueue_one(meta: Meta, st: QueueState, out: Out, pid: Any, pub: Publisher | None, seq: int, size: int,
                 ttl_ms: int | None, idx: int, high: bool = False) -> str:
    if pub is not None:
        if seq <= pub.last_seq:
            if pub.take_missing(seq):
                pass  # overtaken on the way (a resend after a leader change): new, not a duplicate
            elif pub.was_rejected(seq):
                out.rejects.setdefault(pid, []).append(seq)
                return REJECTED
            else:
                out.confirms.setdefault(pid, []).append(seq)
                return DUPLICATE
        else:
            if seq > pub.last_seq + 1:
                pub.add_missing(pub.last_seq + 1, seq - 1)
            pub.last_seq = seq
    cfg = st.config
    if cfg.overflow == "reject-publish" and _would_overflow(st, cfg, size):
        if pub is not None:
            pub.add_rejected(seq)
            out.rejects.setdefault(pid, []).append(seq)
        return REJECTED
    ttl = cfg.message_ttl_ms
    if ttl_ms is not None and (ttl is None or ttl_ms < ttl):
        ttl = ttl_ms
    expires_at = 0
    if ttl is not None:
        # 0 means "never expires": an expiry that lands on 0 (time 0 + TTL 0) is made -1, already past
        expires_at = meta.system_time_ms + ttl or -1
    (st.hi if high else st.messages).append(idx, size, expires_at)
    st.ready_bytes += size
    st.live.add(idx)
    if pub is not None:
        out.confirms.setdefault(pid, []).append(seq)
    return OK


def _would_overflow(st: QueueState, cfg: QuorumConfig, size: int) -> bool:
    dlx = st.dlx
    if cfg.max_length is not None and st.ready_count() + dlx.count >= cfg.max_length:
        return True
    return cfg.max_length_bytes is not None and st.ready_bytes + dlx.bytes + size > cfg.max_length_bytes


def _register_publisher(meta: Meta, cmd: RegisterPublisher, st: QueueState, out: Out) -> None:
    pub = st.publishers.get(cmd.publisher_id)
    if pub is None:
        pub = st.publishers[cmd.publisher_id] = Publisher()
    pub.node = cmd.node
    pub.last_seen_ms = meta.system_time_ms


def _unregister_publisher(meta: Meta, cmd: UnregisterPublisher, st: QueueState, out: Out) -> None:
    st.publishers.pop(cmd.publisher_id, None)


# -- consumers ------------------------------------------------------------------------------------------
def _checkout_cmd(meta: Meta, cmd: Checkout, st: QueueState, out: Out) -> CheckoutReply:
    st.last_active_ms = meta.system_time_ms
    c = st.consumers.checkout(cmd.consumer_key, cmd.prefetch, cmd.auto_ack, cmd.priority, cmd.tag, cmd.node,
                              cmd.channel, out)
    _checkout(meta, st, out)  # so that the reply's ready count is after this consumer's deliveries
    return CheckoutReply(c.status == Status.ACTIVE, st.ready_count())


def _cancel(meta: Meta, cmd: Cancel, st: QueueState, out: Out) -> None:
    c = st.consumers.get(cmd.consumer_key)
    if c is not None:
        st.consumers.cancel(c, out)
        _note_unused(meta, st)


def _credit(meta: Meta, cmd: Credit, st: QueueState, out: Out) -> None:
    c = st.consumers.get(cmd.consumer_key)
    if c is not None and c.auto_ack:
        c.credit += cmd.credit
        st.consumers.serve(c)


def _down(meta: Meta, cmd: Down, st: QueueState, out: Out) -> None:
    owner = cmd.owner
    gone = [c for c in st.consumers.by_key.values() if c.owned_by(owner)]
    for c in gone:
        ids = sorted(c.checked_out)
        _return_msgs(meta, st, c, ids, out)
        st.consumers.remove(c, out)
    if gone:
        _note_unused(meta, st)
    if cmd.reason == "down":
        for pid in [p for p, pub in st.publishers.items() if p == owner or pub.node == owner]:
            del st.publishers[pid]


def _note_unused(meta: Meta, st: QueueState) -> None:
    if not st.consumers.count():
        st.last_active_ms = meta.system_time_ms


# -- settlement -----------------------------------------------------------------------------------------
def _take(st: QueueState, c: Consumer, msg_id: int) -> tuple[int, int, int] | None:
    """Remove a checked-out message from `c`; its (size, expires_at, count), or None if not there."""
    rec = c.checked_out.pop(msg_id, None)
    if rec is None:
        return None
    cs = st.consumers
    cs.unacked -= 1
    cs.unacked_bytes -= rec[0]
    if not c.auto_ack and c.status != Status.GET:
        c.credit += 1
    return rec


def _was_high(st: QueueState, msg_id: int) -> bool:
    """Whether a message leaving its consumer was a high-priority one (and forget that it is out)."""
    hi_out = st.hi_out
    if hi_out and msg_id in hi_out:
        hi_out.discard(msg_id)
        return True
    return False


def _settle(meta: Meta, cmd: Settle, st: QueueState, out: Out) -> None:
    cs = st.consumers
    c = cs.get(cmd.consumer_key)
    if c is None:
        return
    pop = c.checked_out.pop
    settled = []
    nbytes = 0
    for msg_id in cmd.msg_ids:  # what `_take` does, for many
        rec = pop(msg_id, None)
        if rec is not None:
            settled.append(msg_id)
            nbytes += rec[0]
    if settled:
        cs.unacked -= len(settled)
        cs.unacked_bytes -= nbytes
        if not c.auto_ack and c.status != Status.GET:
            c.credit += len(settled)
        st.live.discard_many(settled)
        if st.hi_out:
            st.hi_out.difference_update(settled)
    _after_settlement(st, c)


def _after_settlement(st: QueueState, c: Consumer) -> None:
    st.consumers.serve(c)
    st.consumers.maybe_forget(c)


def _return(meta: Meta, cmd: Return, st: QueueState, out: Out) -> None:
    c = st.consumers.get(cmd.consumer_key)
    if c is not None:
        _return_msgs(meta, st, c, cmd.msg_ids, out)
        _after_settlement(st, c)


def _return_msgs(meta: Meta, st: QueueState, c: Consumer, msg_ids: Any, out: Out) -> None:
    for msg_id in msg_ids:
        rec = _take(st, c, msg_id)
        if rec is not None:
            size, expires_at, count = rec
            _requeue_one(st, msg_id, size, expires_at, count + 1, out, _was_high(st, msg_id))


def _requeue_one(st: QueueState, idx: int, size: int, expires_at: int, count: int, out: Out,
                 high: bool = False) -> None:
    """A failed delivery: dead-letter past the limit, else to the front (limit) or the back of its
    priority's queue (no limit)."""
    limit = st.config.delivery_limit
    if limit is None:
        (st.hi if high else st.messages).append(idx, size, expires_at, count)
    elif count > limit:
        dl.dead_letter(st, out, _DELIVERY_LIMIT, idx, size)
        return
    else:
        st.returns.append((idx, size, expires_at, count))
        if high:
            st.hi_out.add(idx)  # it stays high: back to `hi` if it is returned once there is no limit
    st.ready_bytes += size


def _requeue(meta: Meta, cmd: Requeue, st: QueueState, out: Out) -> None:
    """A return whose message now lives at this entry: the old entry is released."""
    c = st.consumers.get(cmd.consumer_key)
    if c is None:
        return
    rec = _take(st, c, cmd.msg_id)
    if rec is not None:
        st.live.discard(cmd.msg_id)
        idx = meta.index << SHIFT
        st.live.add(idx)
        size, expires_at, count = rec
        _requeue_one(st, idx, size, expires_at, count + 1, out, _was_high(st, cmd.msg_id))
    _after_settlement(st, c)


def _discard(meta: Meta, cmd: Discard, st: QueueState, out: Out) -> None:
    c = st.consumers.get(cmd.consumer_key)
    if c is None:
        return
    for msg_id in cmd.msg_ids:
        rec = _take(st, c, msg_id)
        if rec is not None:
            _was_high(st, msg_id)
            dl.dead_letter(st, out, _REJECTED, msg_id, rec[0])
    _after_settlement(st, c)


# -- queue operations -----------------------------------------------------------------------------------
def _dequeue(meta: Meta, cmd: Dequeue, st: QueueState, out: Out) -> DequeueReply:
    st.last_active_ms = meta.system_time_ms
    rec = _take_next(st, meta, out)
    if rec is None:
        return DequeueReply(None, 0)
    idx, size, expires_at, count = rec
    if cmd.settled:
        st.live.discard(idx)
    else:
        c = st.consumers.get_holder(cmd.consumer_key, cmd.node, cmd.channel)
        _hand_out(st, c, idx, size, expires_at, count)
        if st.last_high:
            st.hi_out.add(idx)
    return DequeueReply((idx, idx, count > 0, count), st.ready_count())


def _purge(meta: Meta, cmd: Purge, st: QueueState, out: Out) -> int:
    """Ready messages only; checked-out ones and dead letters stay."""
    if st.hi_out:
        st.hi_out.difference_update(r[0] for r in st.returns)
    removed = [r[0] for r in st.returns] + st.messages.clear() + st.hi.clear()
    st.returns.clear()
    st.ready_bytes = 0
    live = st.live
    for idx in removed:
        live.discard(idx)
    return len(removed)


def _touch(meta: Meta, cmd: Touch, st: QueueState, out: Out) -> None:
    st.last_active_ms = meta.system_time_ms


def _tick(meta: Meta, cmd: Tick, st: QueueState, out: Out) -> None:
    now = meta.system_time_ms
    expires = st.config.expires_ms
    if expires is not None and not st.consumers.count() and st.last_active_ms is not None \
            and now - st.last_active_ms >= expires:
        out.status.append(DeleteQueue("expires"))
    idle = [pid for pid, p in st.publishers.items() if now - p.last_seen_ms >= PUBLISHER_IDLE_MS]
    for pid in idle:
        del st.publishers[pid]


def _update_config(meta: Meta, cmd: UpdateConfig, st: QueueState, out: Out) -> None:
    old, new = st.config, cmd.config
    st.config = new
    if old.at_least_once and not new.at_least_once:
        dl.drop_all(st, out)
        out.status.append(DlxWorker(False))
    elif new.at_least_once and not old.at_least_once:
        out.status.append(DlxWorker(True))
    st.consumers.set_sac(new.single_active_consumer, out)


def _dlx_checkout(meta: Meta, cmd: DlxCheckout, st: QueueState, out: Out) -> None:
    dl.dlx_checkout(st, cmd.prefetch)


def _dlx_settle(meta: Meta, cmd: DlxSettle, st: QueueState, out: Out) -> None:
    dl.dlx_settle(st, cmd.msg_ids)


_HANDLERS: dict[type, Callable[[Meta, Any, QueueState, Out], Any]] = {
    Enqueue: _enqueue,
    EnqueueBatch: _enqueue_batch,
    RegisterPublisher: _register_publisher,
    UnregisterPublisher: _unregister_publisher,
    Checkout: _checkout_cmd,
    Cancel: _cancel,
    Settle: _settle,
    Return: _return,
    Discard: _discard,
    Requeue: _requeue,
    Credit: _credit,
    Down: _down,
    Dequeue: _dequeue,
    Purge: _purge,
    Touch: _touch,
    Tick: _tick,
    UpdateConfig: _update_config,
    DlxCheckout: _dlx_checkout,
    DlxSettle: _dlx_settle,
}


# -- after every command --------------------------------------------------------------------------------
def _after(meta: Meta, st: QueueState, out: Out) -> None:
    if st.consumers.prios and (st.messages.n or st.returns or st.hi.n):
        _checkout(meta, st, out)
    if st.returns or st.messages.may_expire or st.hi.may_expire:
        _expire_heads(meta, st, out)
    cfg = st.config
    if cfg.has_limits and cfg.overflow == "drop-head":
        _drop_head(st, cfg, out)
    if cfg.has_limits and cfg.overflow == "reject-publish":
        _overflow_status(st, cfg, out)
    elif st.rejecting:
        st.rejecting = False
        out.status.append(OverflowStatus(False))
    if st.dlx.ready and st.dlx.prefetch:
        dl.dlx_deliver(st, out)
    cursor = st.release_cursor()
    if cursor - st.last_cursor >= st.release_step:
        st.last_cursor = cursor
        out.cursor = cursor


def _pop_ready(st: QueueState) -> Record | None:
    """The next ready message, taken off its queue: returns first, then RabbitMQ 4.0's two-level
    weighted queue (rabbit_fifo_q): high priority first, except that every third take (the dequeue
    counter at PRIORITY_WEIGHT) goes to the older of the two heads, so normal messages get at least one
    delivery in three while high ones wait. `st.last_high` says whether it came from the high queue."""
    returns = st.returns
    if returns:
        rec = returns.popleft()
        hi_out = st.hi_out
        st.last_high = bool(hi_out) and rec[0] in hi_out
        if st.last_high:
            hi_out.discard(rec[0])
        return rec
    hi, no = st.hi, st.messages
    if not hi.n and not no.n:
        return None
    c0 = st.out_count
    st.out_count = 0 if c0 >= PRIORITY_WEIGHT else c0 + 1
    high = bool(hi.n) and (not no.n or c0 < PRIORITY_WEIGHT or hi.head_index() < no.head_index())
    st.last_high = high
    return hi.popleft() if high else no.popleft()


def _take_next(st: QueueState, meta: Meta, out: Out) -> Record | None:
    """The next ready message to hand out (`_pop_ready`), dead-lettering expired heads on the way."""
    now = meta.system_time_ms
    fresh = out.fresh
    while True:
        rec = _pop_ready(st)
        if rec is None:
            return None
        st.ready_bytes -= rec[1]
        if rec[2] and rec[2] <= now and rec[0] < fresh:
            dl.dead_letter(st, out, _EXPIRED, rec[0], rec[1])
            continue
        return rec


def _hand_out(st: QueueState, c: Consumer, idx: int, size: int, expires_at: int, count: int) -> None:
    c.checked_out[idx] = (size, expires_at, count)
    cs = st.consumers
    cs.unacked += 1
    cs.unacked_bytes += size
    if not c.auto_ack and c.status != Status.GET:
        c.credit -= 1
        if c.credit <= 0:
            cs.unserve(c)


def _checkout(meta: Meta, st: QueueState, out: Out) -> None:
    """Deliver ready messages to consumers with credit."""
    cs = st.consumers
    live = st.live
    messages = st.messages
    while True:
        c = cs.next()
        if c is None:
            return
        if not st.returns and not st.hi.n and messages.n > 1 and c.credit > 1 and messages.plain \
                and len(cs.groups[c.priority]) == 1:
            _checkout_run(st, c, min(c.credit, messages.n), out)  # the same as one at a time, faster
            continue
        rec = _take_next(st, meta, out)
        if rec is None:
            return
        idx, size, expires_at, count = rec
        if c.auto_ack:
            c.credit -= 1
            live.discard(idx)
        else:
            c.checked_out[idx] = (size, expires_at, count)
            cs.unacked += 1
            cs.unacked_bytes += size
            c.credit -= 1
            if st.last_high:
                st.hi_out.add(idx)
        out.deliver(c.key, (idx, idx, count > 0, count))
        cs.rotate(c)


def _checkout_run(st: QueueState, c: Consumer, n: int, out: Out) -> None:
    """`n` messages in a row to `c`, the only consumer of the highest priority with credit (so each would
    go to it one at a time too), from a ready queue without returns, expiries or delivery counts."""
    ids, sizes = st.messages.take(n)
    nbytes = sum(sizes)
    st.ready_bytes -= nbytes
    cs = st.consumers
    if c.auto_ack:
        st.live.discard_many(ids)
    else:
        c.checked_out.update(zip(ids, [(size, 0, 0) for size in sizes], strict=True))
        cs.unacked += n
        cs.unacked_bytes += nbytes
    c.credit -= n
    batch = out.deliveries.get(c.key)
    if batch is None:
        batch = out.deliveries[c.key] = []
    batch.extend([(i, i, False, 0) for i in ids])
    if c.credit <= 0:  # what `rotate` does for the head of a group of one
        cs.rotate(c)


def _expire_heads(meta: Meta, st: QueueState, out: Out) -> None:
    now = meta.system_time_ms
    returns = st.returns
    while returns and returns[0][2] and returns[0][2] <= now:
        idx, size, _exp, _count = returns.popleft()
        st.hi_out.discard(idx)
        st.ready_bytes -= size
        dl.dead_letter(st, out, _EXPIRED, idx, size)
    for messages in (st.messages, st.hi):
        while messages.n:
            exp = messages.head_expiry()
            if not exp or exp > now:
                break
            idx, size, _exp, _count = messages.popleft()
            st.ready_bytes -= size
            dl.dead_letter(st, out, _EXPIRED, idx, size)


def _drop_head(st: QueueState, cfg: QuorumConfig, out: Out) -> None:
    max_len, max_bytes = cfg.max_length, cfg.max_length_bytes
    while (st.returns or st.messages or st.hi) and (
            (max_len is not None and st.ready_count() + st.dlx.count > max_len)
            or (max_bytes is not None and st.ready_bytes + st.dlx.bytes > max_bytes)):
        rec = _pop_ready(st)  # the message that would be delivered next, as RabbitMQ 4.x drops
        assert rec is not None
        idx, size, _exp, _count = rec
        st.ready_bytes -= size
        dl.dead_letter(st, out, _MAXLEN, idx, size)


def _overflow_status(st: QueueState, cfg: QuorumConfig, out: Out) -> None:
    """reject-publish: tell the channels when the queue fills up and when it has drained below 80%."""
    count, nbytes = st.ready_count() + st.dlx.count, st.ready_bytes + st.dlx.bytes
    max_len, max_bytes = cfg.max_length, cfg.max_length_bytes
    if not st.rejecting:
        if (max_len is not None and count >= max_len) or (max_bytes is not None and nbytes >= max_bytes):
            st.rejecting = True
            out.status.append(OverflowStatus(True))
    elif (max_len is None or count < max_len * 4 // 5 or count == 0) and \
            (max_bytes is None or nbytes < max_bytes * 4 // 5 or nbytes == 0):
        st.rejecting = False
        out.status.append(OverflowStatus(False))


# -- leader change --------------------------------------------------------------------------------------
def leader_effects(st: QueueState) -> list[Effect]:
    """What a newly elected leader's runtime re-issues: every checked-out message again (ids are stable:
    the runtime skips those its consumers' channels already have), the dead letters held by the worker,
    whether the worker should run, the overflow status, and the release cursor."""
    effects: list[Effect] = []
    for c in st.consumers.by_key.values():
        if c.checked_out and c.status != Status.GET:
            effects.append(Deliver(c.key, tuple((i, i, n > 0, n) for i, (_s, _e, n) in c.checked_out.items())))
    if st.config.at_least_once:
        effects.append(DlxWorker(True))
    if st.dlx.checked:
        effects.append(DlxDeliver(tuple((i, i, REASONS[r]) for i, (_s, r) in st.dlx.checked.items())))
    if st.rejecting:
        effects.append(OverflowStatus(True))
    effects.append(ReleaseCursor(st.release_cursor()))
    return effects


# -- the Raft driver's StateMachine ---------------------------------------------------------------------
class QuorumMachine:
    """One replica of a quorum queue behind the Raft driver (runtime/clustering/raft_group.py `StateMachine`).

    `apply(index, data)` decodes the entry, applies it, hands the effects to `effects_sink` (the runtime
    executes them only while this replica leads) and returns the reply for the local proposer. The term
    is not known at apply time through this interface: `Meta.term` is 0 here.
    """

    def __init__(self, config: QuorumConfig | None = None, *,
                 effects_sink: Callable[[list[Effect]], None] | None = None,
                 release_step: int = RELEASE_CURSOR_STEP) -> None:
        self.state = QueueState(config, release_step)
        self.effects_sink = effects_sink

    def apply(self, index: int, data: bytes) -> Any:
        system_time_ms, command = decode(data)
        return self.apply_command(index, system_time_ms, command)

    def apply_command(self, index: int, system_time_ms: int, command: Command) -> Any:
        """`apply` of an entry the caller has decoded already."""
        _state, reply, effects = apply(Meta(index, 0, system_time_ms), command, self.state)
        if effects and self.effects_sink is not None:
            self.effects_sink(effects)
        return reply

    def snapshot(self) -> bytes:
        return self.state.snapshot()

    def restore(self, data: bytes) -> None:
        self.state = QueueState.restore(data)

    def on_membership(self, voters: tuple[int, ...]) -> None:
        pass

    def leader_effects(self) -> list[Effect]:
        return leader_effects(self.state)
