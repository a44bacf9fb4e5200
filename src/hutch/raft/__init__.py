"""Pure Raft core for hutch: no IO, no clock, no threads (see docs/raft.md).

Modules, by concern:
- `messages`: entries, hard state, snapshots, configuration changes and wire messages (values only).
- `storage`: the `Storage` read interface and `MemoryStorage`.
- `log`: the core's view of the log (stable + unstable), commit and apply indexes.
- `progress`: the leader's per-follower replication state, inflight window, quorum arithmetic.
- `membership`: the configuration in force at each index (single-server changes, thesis §4.1).
- `raft`: the protocol state machine (roles, elections, replication, snapshots, transfer).
- `rawnode`: the driver API (`tick`/`step`/`propose`/`ready`/`advance`) and the persistence contract.
"""

from .log import RaftSafetyError
from .messages import (
    NONE,
    CampaignType,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from .raft import Config, ProposalDroppedError, StateType
from .rawnode import RawNode, Ready, SoftState, Status
from .storage import (
    CompactedError,
    MemoryStorage,
    SnapshotTemporarilyUnavailableError,
    Storage,
    StorageError,
    UnavailableError,
    bootstrap_entries,
)

__all__ = [
    "NONE",
    "CampaignType",
    "CompactedError",
    "ConfChange",
    "ConfChangeType",
    "ConfState",
    "Config",
    "Entry",
    "EntryType",
    "HardState",
    "MemoryStorage",
    "Message",
    "MessageType",
    "ProposalDroppedError",
    "RaftSafetyError",
    "RawNode",
    "Ready",
    "Snapshot",
    "SnapshotMeta",
    "SnapshotTemporarilyUnavailableError",
    "SoftState",
    "StateType",
    "Status",
    "Storage",
    "StorageError",
    "UnavailableError",
    "bootstrap_entries",
]
