"""One seeded simulation run: a fault phase, then heal and check liveness.

`run_seed(seed)` is the whole contract: the seed picks the cluster size, the network's fault rates, the
sync latency, the compaction cadence and every event; the same seed replays the same run, bit for bit.
A failure raises `SimViolation` whose message ends with the command that replays it:

    python -m tests.sim.replay SEED [--long] [--trace]
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from hutch.raft import ConfChange, ConfChangeType, MessageType, ProposalDroppedError, RaftSafetyError

from .checker import SimViolation
from .cluster import Cluster, NetParams


@dataclass
class RunStats:
    seed: int
    ticks: int = 0
    messages: int = 0
    commits: int = 0
    crashes: int = 0
    partitions: int = 0
    conf_changes: int = 0
    transfers: int = 0
    leaders: int = 0
    snapshots_sent: int = 0
    message_types: dict[str, int] = field(default_factory=dict)


def replay_command(seed: int, long: bool, broken_driver: bool = False) -> str:
    flags = (" --long" if long else "") + (" --broken-driver" if broken_driver else "")
    return f"python -m tests.sim.replay {seed}{flags}"


def run_seed(
    seed: int,
    *,
    long: bool = False,
    send_before_persist: bool = False,
    trace: Callable[[str], None] | None = None,
) -> RunStats:
    try:
        return _run(seed, long, send_before_persist, trace)
    except (SimViolation, RaftSafetyError) as e:
        raise SimViolation(f"seed {seed}: {e}\n  replay: {replay_command(seed, long, send_before_persist)}") from e


def _run(seed: int, long: bool, send_before_persist: bool, trace: Callable[[str], None] | None) -> RunStats:
    rng = random.Random(seed * 2654435761 + 1)
    n_voters = rng.choice((3, 3, 5))
    spare = rng.choice((0, 1, 2))
    ids = list(range(1, n_voters + spare + 1))
    net = NetParams(
        drop=rng.choice((0.0, 0.02, 0.1, 0.2)),
        dup=rng.choice((0.0, 0.02, 0.1)),
        max_delay=rng.choice((0, 1, 2, 4)),
    )
    cluster = Cluster(
        seed,
        ids,
        tuple(range(1, n_voters + 1)),
        net,
        max_sync_delay=rng.choice((0, 1, 3)),
        compact_every=rng.choice((0, 4, 12, 40)),
        max_entries_per_msg=rng.choice((1, 4, 64)),
        max_inflight_msgs=rng.choice((1, 4, 256)),
        send_before_persist=send_before_persist,
        trace=trace,
    )
    fault_ticks = rng.randint(1000, 3000) if long else rng.randint(80, 200)
    rates = Rates(
        propose=rng.choice((0.1, 0.3, 0.8)),
        crash=rng.choice((0.0, 0.01, 0.03)),
        partition=rng.choice((0.0, 0.01, 0.04)),
        conf=rng.choice((0.0, 0.02, 0.05)) if spare or n_voters == 5 else rng.choice((0.0, 0.02)),
        transfer=rng.choice((0.0, 0.01, 0.03)),
        tick_skip=rng.choice((0.0, 0.1)),
    )
    stats = RunStats(seed)
    for _ in range(fault_ticks):
        _faults_and_operations(cluster, rates, stats)
        cluster.step_time(rates.tick_skip)

    _check_liveness(cluster, stats)
    stats.ticks = cluster.now
    stats.messages = cluster.net.sent
    stats.commits = cluster.checker.max_committed
    stats.leaders = len(cluster.checker.leaderships)
    stats.snapshots_sent = cluster.net.by_type.get(MessageType.SNAP, 0)
    stats.message_types = {t.name: c for t, c in cluster.net.by_type.items()}
    return stats


@dataclass
class Rates:
    """Per-tick probabilities of the scenario's events, drawn from the seed."""

    propose: float
    crash: float
    partition: float
    conf: float
    transfer: float
    tick_skip: float
    restart: float = 0.1
    heal: float = 0.08


def _faults_and_operations(cluster: Cluster, p: Rates, stats: RunStats) -> None:
    sched = cluster.rng
    ids = cluster.ids
    if sched.random() < p.propose:
        lead = cluster.leader()
        target = lead if lead is not None and sched.random() < 0.9 else sched.choice(ids)
        if sched.random() < 0.2:
            _propose_batch(cluster, target)
        else:
            cluster.propose(target)
    if p.crash and sched.random() < p.crash and cluster.live:
        stats.crashes += 1
        cluster.crash(sched.choice(sorted(cluster.live)))
    if sched.random() < p.restart:
        down = [i for i in ids if i not in cluster.live]
        if down:
            cluster.start(sched.choice(down))
    if p.partition and sched.random() < p.partition:
        side = {i for i in ids if sched.random() < 0.5}
        stats.partitions += 1
        cluster.net.partition(side, ids)
        cluster._trace(f"partition {sorted(side)} | rest")
    elif cluster.net.blocked and sched.random() < p.heal:
        cluster.net.heal()
        cluster._trace("heal")
    if p.conf and sched.random() < p.conf:
        _conf_change(cluster, sched, stats)
    if p.transfer and sched.random() < p.transfer:
        lead = cluster.leader()
        if lead is not None:
            others = [v for v in cluster.live[lead].raft.log.config.current.voters if v != lead]
            if others:
                stats.transfers += 1
                cluster.transfer_leader(lead, sched.choice(others))


def _propose_batch(cluster: Cluster, target: int) -> None:
    raw = cluster.live.get(target)
    if raw is None:
        return
    cluster.next_command += 3
    try:
        raw.propose_batch([b"b%d-%d" % (cluster.next_command, k) for k in range(3)])
    except ProposalDroppedError:
        return
    cluster.drive(target)
    cluster.check()


def _conf_change(cluster: Cluster, sched: random.Random, stats: RunStats) -> None:
    lead = cluster.leader()
    if lead is None:
        return
    voters = cluster.live[lead].raft.log.config.current.voters
    outside = [i for i in cluster.ids if i not in voters]
    if outside and (len(voters) < 3 or sched.random() < 0.5):
        cc = ConfChange(ConfChangeType.ADD_NODE, sched.choice(outside))
    elif len(voters) > 1:
        cc = ConfChange(ConfChangeType.REMOVE_NODE, sched.choice(voters))
    else:
        return
    if cluster.propose_conf_change(lead, cc) is not None:
        stats.conf_changes += 1


def _replication_progress(cluster: Cluster) -> int:
    """Grows while a backlog drains: the commit index plus the matches the current leader knows."""
    lead = cluster.leader()
    if lead is None:
        return 0
    r = cluster.live[lead].raft
    return cluster.checker.max_committed + sum(pr.match for pr in r.prs.progress.values())


def _check_liveness(cluster: Cluster, stats: RunStats) -> None:
    """Heal everything, restart every node, stop dropping: a leader must emerge and commit a proposal."""
    cluster.net.heal()
    cluster.net.params = NetParams(drop=0.0, dup=0.0, max_delay=cluster.net.params.max_delay)
    for i in cluster.ids:
        if i not in cluster.live:
            cluster.start(i)
    cluster._trace("liveness phase: healed, all nodes up, no drops")
    # Quiet time is bounded by progress: a backlog left by the fault phase may take a while to replicate
    # with a 1-entry, 1-in-flight configuration, but the commit index must keep moving.
    budget = 60 * cluster.election_tick
    start = cluster.now
    deadline = cluster.now + budget
    hard_deadline = cluster.now + 10 * budget
    last_progress = _replication_progress(cluster)
    probe: tuple[int, int, int, bytes] | None = None  # leader, term, index, data
    while cluster.now < min(deadline, hard_deadline):
        cluster.step_time()
        progress = _replication_progress(cluster)
        if progress > last_progress:
            last_progress = progress
            deadline = max(deadline, cluster.now + budget)
        lead = cluster.leader()
        if lead is None:
            continue
        raw = cluster.live[lead]
        if probe is None or probe[0] != lead or probe[1] != raw.raft.term:
            data = b"live-%d" % cluster.now
            index = cluster.propose(lead, data)
            probe = (lead, raw.raft.term, index, data) if index is not None else None
            continue
        index, data = probe[2], probe[3]
        entry = cluster.checker.committed.get(index)
        if entry is None or entry.data != data:
            continue
        voters = raw.raft.log.config.current.voters
        if all(cluster.nodes[v].applied_index >= index for v in voters):
            return
    states: dict[int, object] = {
        i: (r.raft.state.name, r.raft.term, r.raft.log.committed) for i, r in cluster.live.items()
    }
    lead = cluster.leader()
    if lead is not None:
        states["progress"] = cluster.live[lead].status().progress
    raise SimViolation(f"liveness: no commit within {cluster.now - start} quiet ticks; {states}")
