"""Policies on a running node: setting and clearing them, applying them to queues and exchanges, and
saving them with the durable definitions.

Owns: the node-side operations on `Node.policies` (a `hutch.core.policy.PolicyStore`): `set_policy`,
`clear_policy`, `forget_vhost`, the hooks `Node` calls when it creates a queue or an exchange, and the
definition-log operations (`SetPolicy`, `ClearPolicy` of core/definition_ops.py, regular or operator)
with their replay (`apply_op`) and their place in a snapshot (`state_ops`).

Rules:
- A change takes effect at once: every queue of the vhost gets `Queue.apply_settings` with its new
  effective settings (only when they changed), every exchange its policy name and alternate exchange.
  The work is O(objects in the vhost x policies in the vhost) regex searches, on the event loop, in
  slices of `REFRESH_SLICE_S` (issue 21: one policymaker's 4,091-character pattern over 100 queues
  stalled every vhost 11.3 s): the first slice runs before the change returns (a vhost of ordinary size
  is done in it), the rest on the next turns of the loop, and a newer change to the same vhost starts
  the refresh again from the start. Search results are cached per (pattern, name) (core/patterns.py),
  so a refresh re-checks the other policies of the vhost from the cache and pays only for the changed one.
- A change is recorded (fdatasync'd) before the caller replies, like every durable definition. The
  policy document is stored as JSON text, so any JSON number survives (msgpack caps integers at 64 bits).
- Deleting a vhost records a clear for each of its policies first, so a replay that later re-creates
  a vhost of the same name does not resurrect them.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

from hutch.core.definition_ops import ClearPolicy, SetPolicy
from hutch.core.policy import Policy, effective_settings, exchange_alternate
from hutch.core.routing import Exchange

if TYPE_CHECKING:
    from hutch.core.definition_ops import DefinitionOp
    from hutch.core.policy import PolicyStore
    from hutch.core.queue_type import Queue
    from hutch.core.vhost import VirtualHost



class PolicyHost(Protocol):
    """What policies need of the node (`broker/node.py`): its vhosts, policy store and definitions log."""

    vhosts: dict[str, VirtualHost]
    policies: PolicyStore
    policy_refreshes: dict[str, asyncio.Handle]  # vhost -> the next slice of its refresh (refresh_vhost)

    def _record(self, op: DefinitionOp) -> None: ...



def set_policy(node: PolicyHost, policy: Policy, operator: bool = False) -> bool:
    """Add or replace a (validated) policy, record it, apply it; True if it is new. Setting a policy
    identical to the current one changes nothing (RabbitMQ's {old, Term})."""
    store = node.policies
    if store.get(policy.vhost, policy.name, operator) == policy:
        return False
    created = store.set(policy, operator)
    node._record(SetPolicy(policy.vhost, policy.name, json.dumps(policy.to_dict()), operator))
    vhost = node.vhosts.get(policy.vhost)
    if vhost is not None:
        refresh_vhost(node, vhost)
    return created


def clear_policy(node: PolicyHost, vhost_name: str, name: str, operator: bool = False) -> bool:
    """Remove a policy, record it, re-apply what is left; False if there was no such policy."""
    if node.policies.clear(vhost_name, name, operator) is None:
        return False
    node._record(ClearPolicy(vhost_name, name, operator))
    vhost = node.vhosts.get(vhost_name)
    if vhost is not None:
        refresh_vhost(node, vhost)
    return True


def forget_vhost(node: PolicyHost, vhost_name: str) -> None:
    """The vhost is about to be deleted: clear its policies (recorded while the vhost still exists)."""
    store = node.policies
    for operator in (False, True):
        for p in store.list(vhost_name, operator):
            store.clear(vhost_name, p.name, operator)
            node._record(ClearPolicy(vhost_name, p.name, operator))


# -- applying ---------------------------------------------------------------------------------------


def apply_to_queue(node: PolicyHost, q: Queue) -> None:
    """Give a queue the settings its x-arguments and matching policies add up to (if they changed)."""
    policy, operator_policy = node.policies.match_queue(q.vhost, q.name, q.queue_type)
    settings = effective_settings(q.arguments, policy, operator_policy)
    if settings != q.settings:
        q.apply_settings(settings)


def apply_to_exchange(node: PolicyHost, x: Exchange) -> None:
    """Give an exchange its policy name and the alternate exchange (its argument wins)."""
    policy, _operator_policy = node.policies.match_exchange(x.vhost, x.name)
    x.policy = policy.name if policy is not None else None
    x.alternate_exchange = exchange_alternate(x.arguments, policy)


REFRESH_SLICE_S = 0.02  # at most this long on the loop per slice of a vhost's refresh (then it yields)


def refresh_vhost(node: PolicyHost, vhost: VirtualHost) -> None:
    """Re-apply the policies of a vhost to every queue and exchange in it, in slices (see the rules)."""
    pending = node.policy_refreshes.pop(vhost.name, None)
    if pending is not None:
        pending.cancel()  # this refresh covers everything the older one had left
    objects: list[Queue | Exchange] = [*vhost.queues.values(), *vhost.exchanges.values()]
    _refresh_slice(node, vhost, objects, 0)


def _refresh_slice(node: PolicyHost, vhost: VirtualHost, objects: list[Queue | Exchange], start: int) -> None:
    node.policy_refreshes.pop(vhost.name, None)
    if node.vhosts.get(vhost.name) is not vhost:
        return  # deleted since
    deadline = time.monotonic() + REFRESH_SLICE_S
    i = start
    while i < len(objects):
        obj = objects[i]
        i += 1
        if isinstance(obj, Exchange):
            if vhost.exchanges.get(obj.name) is obj:
                apply_to_exchange(node, obj)
        elif vhost.queues.get(obj.name) is obj:  # not deleted since the refresh started
            apply_to_queue(node, obj)
        if i < len(objects) and time.monotonic() > deadline:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a tool or a pure test): finish here
                continue
            node.policy_refreshes[vhost.name] = loop.call_soon(_refresh_slice, node, vhost, objects, i)
            return


# -- durable definitions ----------------------------------------------------------------------------


def apply_op(node: PolicyHost, op: SetPolicy | ClearPolicy) -> None:
    """Replay one saved operation (the node has checked that its vhost exists)."""
    if isinstance(op, SetPolicy):
        set_policy(node, Policy.from_dict(json.loads(op.policy), operator=op.operator), op.operator)
    else:
        clear_policy(node, op.vhost, op.name, op.operator)


def state_ops(node: PolicyHost) -> Iterator[SetPolicy]:
    """Every policy of an existing vhost as the operation that sets it (regular ones first)."""
    for operator, p in node.policies:
        if p.vhost in node.vhosts:
            yield SetPolicy(p.vhost, p.name, json.dumps(p.to_dict()), operator)


__all__ = ["apply_op", "apply_to_exchange", "apply_to_queue", "clear_policy", "forget_vhost",
           "refresh_vhost", "set_policy", "state_ops"]
