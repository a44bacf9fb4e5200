"""The control socket between the supervisor and one worker: its messages and their encoding.

Owns: the message kinds and `encode`/`decode`. The socket is an `AF_UNIX` `SOCK_SEQPACKET` pair the
supervisor made (message boundaries kept, so a descriptor passed with `SCM_RIGHTS` arrives with its own
message). Every message is one JSON object of at most `MAX_MESSAGE_BYTES`:

- worker → supervisor: `{"hb": 1}` every `beat_interval_s(workers.heartbeat_timeout)` (the worker's event
  loop is turning: a worker silent for the heartbeat timeout is hung and is replaced; the supervisor
  judges every `HEARTBEAT_S`), `{"ready": {listener: port}}` once its listeners accept clients.
- supervisor → worker: `{"peer": N}` with one descriptor: this worker's end of a new socket pair to
  worker N (N was restarted); the worker adopts it into its worker link.
- connection locality (runtime/workers/handover.py): worker → supervisor `{"handover": N, "state": S}`
  with a client socket's descriptor, its state S inline (base64, at most `INLINE_STATE_BYTES` before
  encoding), or `{"handover": N}` with two descriptors (the client's, and a socket its larger state
  follows on); relayed to worker N as `{"adopt": M, ...}` (M the sender, the rest as it came) when N is
  ready; otherwise the supervisor closes them (the client's TCP connection ends: it reconnects).
- compaction of load (runtime/workers/island.py): worker → supervisor `{"island": N}` with the descriptor
  of a socket the island's state follows on, then those of its connections' sockets (at most
  `MAX_FDS` in all); relayed to worker N as `{"adopt_island": M}` with them, or closed.
- `hutchctl join_cluster` on a node of workers: worker 0 → supervisor `{"rejoin": "NODE@HOST:PORT"}`; the
  supervisor stops every worker, resets their data and starts them again with `--join` (supervisor.py,
  `_rejoin`).
- A request/answer pair for the management fan-out can ride the same socket later
  (`{"ask": id, ...}` / `{"answer": id, ...}`): the kinds are open, an unknown one is ignored.
"""

from __future__ import annotations

import json
from typing import Any

HEARTBEAT_S = 0.5  # how often the supervisor judges the workers' heartbeats
MAX_BEAT_S = 1.0  # a worker beats at most this far apart (and at least 5 times per heartbeat timeout)


def beat_interval_s(heartbeat_timeout_ms: int) -> float:
    """How often a worker sends `{"hb": 1}`: five beats per heartbeat timeout, at most one a second (the
    default 5 s timeout: one a second; every beat is a wake-up of an idle worker and of the supervisor)."""
    return min(MAX_BEAT_S, heartbeat_timeout_ms / 5000)
MAX_MESSAGE_BYTES = 65536
MAX_FDS = 16  # descriptors one control message may carry (an island's: its state's socket and its connections)
# connection locality: the largest state of a handed-over connection (its unread bytes are at most one
# read, 256 KiB under uvloop, plus a partial frame of frame_max), and the part of it the unread bytes may take
MAX_UNREAD_BYTES = 1 << 20
MAX_STATE_BYTES = MAX_UNREAD_BYTES + (256 << 10)
INLINE_STATE_BYTES = 32 << 10  # a state up to this rides in the control message (base64 fits 64 KiB)
# compaction of load: an island's state (its queue's messages and its connections') always follows on a socket
# pair of its own, at most this long
MAX_ISLAND_STATE_BYTES = 64 << 20
ALARM_NAMES = frozenset({"memory", "disk"})  # the resource alarms a worker reports and is told (node-wide)


def encode(kind: str, value: Any) -> bytes:  # Any: a JSON value
    data = json.dumps({kind: value}, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return data


def encode_move(kind: str, index: int, state: str | None) -> bytes:
    """A connection locality message: `{kind: index}`, with `"state"` (base64 text) when inline."""
    doc: dict[str, object] = {kind: index} if state is None else {kind: index, "state": state}
    data = json.dumps(doc, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValueError(f"control message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return data


def decode(data: bytes) -> dict[str, Any]:  # Any: JSON values, checked by the reader of each kind
    """One control message; ValueError if it is not a JSON object."""
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("a control message is a JSON object")
    return doc
