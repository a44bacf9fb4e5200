"""The replicated metadata machine: what every node of a cluster applies from the metadata Raft group.

Owns: the command format of the metadata group, the cluster member table (name -> raft id and
inter-node address), and the snapshot format. The definitions themselves (vhosts, users,
permissions, exchanges, queues, bindings, policies) belong to the node: the machine hands their
operations to a `MetadataTarget` (the runtime's Node), in commit order, on every node.

Rules:
- A log entry is a msgpack map {"ops": [op, ...]}: one proposal carries every operation a node made in
  one event-loop iteration (a definitions import is one entry, not thousands).
- An operation is a record of core/definition_ops.py (the node's own definition operations), stored in its
  map form (`to_stored`: {"op": "queue.declare", ...}) and stamped with "inc": the incarnation (random per
  process start) of the node that made it. A node
  applies a change to its own state before proposing it (the change was validated against a state
  that a read barrier had just brought up to date), so it skips operations carrying its own current
  incarnation; every other node, and the same node after a restart, applies them.
- Cluster operations (`ClusterJoin`, `ClusterLeave`) change the member table; `Noop` changes nothing
  (read barriers). Unknown or malformed operations are logged and skipped, never fatal: a newer node's
  command must not stop an older one from applying the log.
- Applying is deterministic given the log: no clock, no randomness, no IO here.
- Invariant: `members` maps every node name to a distinct raft id; raft ids are never reused (the
  next id is one more than the highest ever given, kept in the snapshot).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from hutch.core import definition_ops as ops_
from hutch.core.definition_ops import DefinitionOp

log = logging.getLogger("hutch.cluster.metadata")

METADATA_GROUP = 1  # the raft group id of the metadata group; quorum queues use ids above it


@dataclass(frozen=True)
class Member:
    name: str
    raft_id: int
    host: str
    port: int

    def to_list(self) -> list[Any]:
        return [self.name, self.raft_id, self.host, self.port]

    @classmethod
    def from_list(cls, v: list[Any]) -> Member:
        return cls(str(v[0]), int(v[1]), str(v[2]), int(v[3]))


class MetadataTarget(Protocol):
    def apply_op(self, op: DefinitionOp) -> None: ...  # raises on an operation that cannot apply

    def state_ops(self) -> list[DefinitionOp]: ...

    def reset_to(self, ops: list[DefinitionOp]) -> None: ...

    def members_changed(self) -> None: ...


def encode_ops(ops: list[DefinitionOp], incarnation: str | None = None) -> bytes:
    """One entry of the metadata group: `ops` in their stored form, each stamped with `incarnation`."""
    stored = [ops_.to_stored(op) for op in ops]
    if incarnation is not None:
        for item in stored:
            item["inc"] = incarnation
    return msgpack.packb({"ops": stored}, use_bin_type=True)


def decode_ops(data: bytes, index: int = 0) -> list[tuple[str | None, DefinitionOp]]:
    """The (incarnation, operation) pairs of an entry; an operation this version cannot read is logged and
    left out."""
    doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
    return [(item.get("inc") if isinstance(item, dict) else None, op) for item, op in _decoded(doc["ops"], index)]


def _decoded(items: list[Any], index: int) -> list[tuple[Any, DefinitionOp]]:
    out = []
    for item in items:
        try:
            out.append((item, ops_.from_stored(item)))
        except ops_.DefinitionOpError as exc:
            log.warning("metadata entry %d: skipping an operation: %s", index, exc)
    return out


class MetadataMachine:
    """The state machine of the metadata group (the `StateMachine` protocol of runtime/clustering/raft_driver.py)."""

    def __init__(self, target: MetadataTarget, incarnation: str) -> None:
        self.target = target
        self.incarnation = incarnation
        self.members: dict[str, Member] = {}
        self.next_raft_id = 1
        self.voters: tuple[int, ...] = ()
        self.applied_index = 0
        self.failed_ops = 0  # operations that could not apply on this node (logged)
        self.on_applied: Callable[[int], None] | None = None  # after each entry (the runtime's waiters)

    # -- the member table ------------------------------------------------------------------------------
    def member_by_id(self, raft_id: int) -> Member | None:
        for m in self.members.values():
            if m.raft_id == raft_id:
                return m
        return None

    def _join(self, op: ops_.ClusterJoin) -> int:
        name = op.name
        existing = self.members.get(name)
        raft_id = existing.raft_id if existing is not None else (op.raft_id or self.next_raft_id)
        self.members[name] = Member(name, raft_id, op.host, op.port)
        self.next_raft_id = max(self.next_raft_id, raft_id + 1)
        return raft_id

    # -- StateMachine ----------------------------------------------------------------------------------
    def apply(self, index: int, data: bytes) -> int:
        """Apply one entry; returns its index (the proposer waits for this node to reach it)."""
        self.applied_index = index
        changed_members = False
        for incarnation, op in decode_ops(data, index):
            if type(op) is ops_.Noop:
                continue
            if type(op) is ops_.ClusterJoin:
                self._join(op)
                changed_members = True
                continue
            if type(op) is ops_.ClusterLeave:
                self.members.pop(op.name, None)
                changed_members = True
                continue
            if incarnation == self.incarnation and type(op) not in (ops_.PatchAuth, ops_.PatchTopicPermissions):
                # made here, by this process: already applied before it was proposed. (A PatchAuth or a
                # PatchTopicPermissions is applied again, in the log's order: two members changing one user
                # at once then end with the same one, the later entry's, on both; re-applying its own
                # entries is a no-op.)
                continue
            try:
                self.target.apply_op(op)
            except Exception as exc:  # a definition that does not apply here must not stop the log
                self.failed_ops += 1
                log.warning("metadata entry %d: cannot apply %s: %s", index, ops_.kind_of(op), exc)
        if changed_members:
            self.target.members_changed()
        if self.on_applied is not None:
            self.on_applied(index)
        return index

    def snapshot(self) -> bytes:
        return msgpack.packb({"members": [m.to_list() for m in self.members.values()],
                              "next_raft_id": self.next_raft_id,
                              "ops": [ops_.to_stored(op) for op in self.target.state_ops()]}, use_bin_type=True)

    def restore(self, data: bytes) -> None:
        doc = msgpack.unpackb(data, raw=False, strict_map_key=False)
        self.members = {m.name: m for m in (Member.from_list(v) for v in doc["members"])}
        self.next_raft_id = int(doc["next_raft_id"])
        self.target.reset_to([op for _item, op in _decoded(doc["ops"], 0)])
        self.target.members_changed()

    def on_membership(self, voters: tuple[int, ...]) -> None:
        self.voters = tuple(voters)
        self.target.members_changed()
