"""The Raft paper's scenarios as named tests, each quoting the sentence it checks.

References: "In Search of an Understandable Consensus Algorithm (Extended Version)", Ongaro & Ousterhout
2014 (§N), and Ongaro's PhD thesis "Consensus: Bridging Theory and Practice" 2014 (thesis §N).
Messages are delivered synchronously by `Net`, a tiny deterministic harness following the driver
contract (persist -> send -> apply -> advance); links can be cut and message types dropped.
"""

from __future__ import annotations

import random
import sys

import pytest

from hutch.raft import (
    CampaignType,
    ConfChange,
    ConfChangeType,
    Config,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    MessageType,
    ProposalDroppedError,
    RawNode,
    StateType,
    bootstrap_entries,
)
from hutch.raft.raft import Raft

MT = MessageType
ADD, REMOVE = ConfChangeType.ADD_NODE, ConfChangeType.REMOVE_NODE


class Net:
    def __init__(
        self,
        ids: list[int],
        *,
        storages: dict[int, MemoryStorage] | None = None,
        **cfg: object,
    ) -> None:
        self.cfg = {"election_tick": 10, "heartbeat_tick": 1, **cfg}
        self.storages = {i: (storages or {}).get(i) or MemoryStorage.bootstrap(ids) for i in ids}
        self.nodes: dict[int, RawNode] = {}
        self.applied: dict[int, list[bytes]] = {}
        self.cut: set[tuple[int, int]] = set()
        self.drop_types: set[MessageType] = set()
        self.delivered: list[Message] = []
        for i in ids:
            self.start(i)

    def start(self, i: int) -> None:
        st = self.storages.setdefault(i, MemoryStorage())
        snap = st.snapshot()
        cfg = Config(id=i, rng=random.Random(i), applied=snap.index, **self.cfg)  # type: ignore[arg-type]
        self.nodes[i] = RawNode(cfg, st)
        self.applied[i] = snap.data.split(b"\n") if snap.data else []

    def crash(self, i: int) -> None:
        del self.nodes[i]

    def raft(self, i: int) -> Raft:
        return self.nodes[i].raft

    def isolate(self, i: int) -> None:
        for j in self.storages:
            if j != i:
                self.cut |= {(i, j), (j, i)}

    def recover(self) -> None:
        self.cut.clear()
        self.drop_types.clear()

    def _collect(self) -> list[Message]:
        out: list[Message] = []
        for i, node in self.nodes.items():
            while node.has_ready():
                rd = node.ready()
                st = self.storages[i]
                if rd.snapshot is not None:
                    st.apply_snapshot(rd.snapshot)
                    self.applied[i] = rd.snapshot.data.split(b"\n") if rd.snapshot.data else []
                st.append(rd.entries)
                if rd.hard_state is not None:
                    st.set_hard_state(rd.hard_state)
                out.extend(rd.messages)
                self.applied[i].extend(e.data for e in rd.committed_entries if e.type is EntryType.NORMAL and e.data)
                node.advance(rd)
        return out

    def flush(self) -> None:
        for _ in range(10_000):
            msgs = self._collect()
            if not msgs:
                return
            for m in msgs:
                self.deliver(m)
        raise AssertionError("messages never settled")

    def deliver(self, m: Message) -> None:
        if (m.sender, m.to) in self.cut or m.to not in self.nodes or m.type in self.drop_types:
            return
        self.delivered.append(m)
        self.nodes[m.to].step(m)

    def tick(self, i: int, n: int = 1) -> None:
        for _ in range(n):
            self.nodes[i].tick()
            self.flush()

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for node in list(self.nodes.values()):
                node.tick()
            self.flush()

    def elect(self, i: int) -> None:
        self.nodes[i].campaign()
        self.flush()
        assert self.raft(i).state is StateType.LEADER

    def propose(self, i: int, data: bytes) -> int:
        index = self.nodes[i].propose(data)
        self.flush()
        return index

    def leaders(self) -> list[int]:
        return [i for i in self.nodes if self.raft(i).state is StateType.LEADER]

    def log_terms(self, i: int) -> list[int]:
        log = self.raft(i).log
        return [e.term for e in log.slice(log.first_index(), log.last_index() + 1)]


def storage_with_terms(ids: list[int], terms: list[int], term: int) -> MemoryStorage:
    """A founding member whose log has entries of `terms` (the first 3 are the bootstrap's, term 1)."""
    st = MemoryStorage()
    boot, hs = bootstrap_entries(ids)
    assert terms[: len(boot)] == [1] * len(boot)
    st.append(boot + [Entry(t, i + 1, EntryType.NORMAL, b"t%d-i%d" % (t, i + 1)) for i, t in enumerate(terms) if i >= len(boot)])
    st.set_hard_state(HardState(term=term, vote=0, commit=hs.commit))
    return st


# -- §5.2 leader election -------------------------------------------------------------------------


def test_follower_becomes_candidate_after_election_timeout() -> None:
    """§5.2: "If a follower receives no communication over a period of time called the election timeout,
    then it assumes there is no viable leader and begins an election"."""
    net = Net([1, 2, 3], pre_vote=False)
    r = net.raft(1)
    for _ in range(2 * r.election_timeout):
        net.nodes[1].tick()
    assert r.state is StateType.CANDIDATE
    assert r.term == 2 and r.vote == 1  # "it increments its current term ... votes for itself"


def test_randomized_election_timeouts() -> None:
    """§5.2: "election timeouts are chosen randomly from a fixed interval (e.g., 150–300ms)"."""
    seen = set()
    for seed in range(200):
        r = Raft(Config(id=1, election_tick=10, rng=random.Random(seed)), MemoryStorage.bootstrap([1, 2, 3]))
        seen.add(r.randomized_election_timeout)
    assert min(seen) >= 10 and max(seen) < 20 and len(seen) > 5


def test_candidate_wins_with_majority() -> None:
    """§5.2: "A candidate wins an election if it receives votes from a majority of the servers in the full
    cluster for the same term"."""
    net = Net([1, 2, 3, 4, 5])
    net.isolate(4)
    net.isolate(5)
    net.cut -= {(4, 5), (5, 4)}
    net.elect(1)  # votes from 1, 2, 3: a majority of 5
    assert net.leaders() == [1]
    net2 = Net([1, 2, 3, 4, 5])
    for j in (3, 4, 5):
        net2.isolate(j)
    net2.nodes[1].campaign()
    net2.flush()
    assert net2.raft(1).state is not StateType.LEADER  # 2 of 5 is not enough


def test_each_server_votes_once_per_term() -> None:
    """§5.2: "Each server will vote for at most one candidate in a given term, on a first-come-first-served
    basis"."""
    r = Raft(Config(id=3, pre_vote=False, check_quorum=False), MemoryStorage.bootstrap([1, 2, 3]))
    r.step(Message(MT.VOTE, to=3, sender=1, term=2, index=3, log_term=1))
    r.step(Message(MT.VOTE, to=3, sender=2, term=2, index=3, log_term=1))
    resps = [m for m in r.msgs if m.type is MT.VOTE_RESP]
    assert [(m.to, m.reject) for m in resps] == [(1, False), (2, True)]
    r.step(Message(MT.VOTE, to=3, sender=1, term=2, index=3, log_term=1))  # a retry is granted again
    assert r.msgs[-1].to == 1 and not r.msgs[-1].reject


def test_vote_denied_to_candidate_with_less_up_to_date_log() -> None:
    """§5.4.1: "the voter denies its vote if its own log is more up-to-date than that of the candidate"
    (compare last terms, then lengths)."""
    st = storage_with_terms([1, 2, 3], [1, 1, 1, 2, 2], term=2)
    cases = [(5, 2, False), (4, 2, True), (9, 1, True), (1, 3, False), (5, 1, True)]
    for index, log_term, rejected in cases:
        r = Raft(Config(id=3, pre_vote=False, check_quorum=False), st)
        r.step(Message(MT.VOTE, to=3, sender=1, term=3, index=index, log_term=log_term))
        assert r.msgs[-1].reject is rejected, (index, log_term)


def test_candidate_recognises_leader_of_same_term() -> None:
    """§5.2: "If the AppendEntries RPC is from a leader whose term is at least as large as the candidate's
    current term, then the candidate recognizes the leader as legitimate and returns to follower state"."""
    r = Raft(Config(id=1, pre_vote=False), MemoryStorage.bootstrap([1, 2, 3]))
    r.campaign(CampaignType.ELECTION)
    assert r.state is StateType.CANDIDATE
    r.step(Message(MT.APP, to=1, sender=2, term=r.term, index=3, log_term=1, commit=3))
    assert r.state is StateType.FOLLOWER and r.lead == 2


def test_stale_term_messages_rejected() -> None:
    """§5.1: "If a server receives a request with a stale term number, it rejects the request"."""
    net = Net([1, 2, 3], check_quorum=False)
    net.elect(1)
    net.elect(2)  # term 3 now
    old = Message(MT.APP, to=3, sender=1, term=2, index=3, log_term=1, entries=(Entry(2, 4, data=b"x"),))
    net.deliver(old)
    assert net.raft(3).log.last_index() == net.raft(2).log.last_index()
    assert b"x" not in net.applied[3]


# -- §5.3 log replication -------------------------------------------------------------------------


def test_leader_commits_once_replicated_on_majority() -> None:
    """§5.3: "A log entry is committed once the leader that created the entry has replicated it on a
    majority of the servers"; followers then apply it ("once a follower learns that a log entry is
    committed, it applies the entry to its local state machine")."""
    net = Net([1, 2, 3, 4, 5])
    net.elect(1)
    net.isolate(4)
    net.isolate(5)
    index = net.propose(1, b"a")
    assert net.raft(1).log.committed == index
    assert all(net.applied[i] == [b"a"] for i in (1, 2, 3))
    net.isolate(3)
    index = net.propose(1, b"b")
    assert net.raft(1).log.committed == index - 1  # 2 of 5: not committed
    net.recover()
    net.tick(1)  # a heartbeat answer makes the leader resend
    assert all(net.applied[i] == [b"a", b"b"] for i in net.nodes)


# Figure 7: the leader's log and followers (a)-(f) (the first three term-1 entries are the bootstrap's).
FIG7_LEADER = [1, 1, 1, 4, 4, 5, 5, 6, 6, 6]
FIG7_FOLLOWERS = {
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


@pytest.mark.parametrize("name", sorted(FIG7_FOLLOWERS))
def test_figure7_leader_brings_follower_logs_into_consistency(name: str) -> None:
    """§5.3, Figure 7: "the leader handles inconsistencies by forcing the followers' logs to duplicate its
    own. ... conflicting entries in follower logs will be overwritten with entries from the leader's log"."""
    ids = [1, 2, 3]
    net = Net(
        ids,
        storages={
            1: storage_with_terms(ids, FIG7_LEADER, term=7),
            2: storage_with_terms(ids, FIG7_FOLLOWERS[name], term=7),
            3: MemoryStorage(),  # a black hole: never started
        },
        pre_vote=False,
    )
    net.crash(3)
    net.nodes[1].campaign()  # term 8
    net.flush()
    if net.raft(1).state is not StateType.LEADER:  # (c), (d) are more up-to-date: vote comes from 3
        net.deliver(Message(MT.VOTE_RESP, to=1, sender=3, term=net.raft(1).term))
        net.flush()
    assert net.raft(1).state is StateType.LEADER and net.raft(1).term == 8
    net.tick(1)
    assert net.log_terms(2) == net.log_terms(1) == FIG7_LEADER + [8]
    rejects = sum(1 for m in net.delivered if m.type is MT.APP_RESP and m.reject)
    assert rejects <= 3  # fast backtracking: about one round trip per conflicting term, not per entry


def test_leader_only_commits_entries_of_its_term_figure8() -> None:
    """§5.4.2, Figure 8: "Raft never commits log entries from previous terms by counting replicas. Only
    log entries from the leader's current term are committed by counting replicas"."""
    ids = [1, 2, 3, 4, 5]
    # S1 is leader in term 4 holding (index 4, term 2) that S2 and S3 store, i.e. a majority with S1.
    st = storage_with_terms(ids, [1, 1, 1, 1, 1, 2], term=3)
    r = Raft(Config(id=1, pre_vote=False), st)
    r.campaign(CampaignType.ELECTION)
    for v in (2, 3):
        r.step(Message(MT.VOTE_RESP, to=1, sender=v, term=4))
    assert r.state is StateType.LEADER and r.log.last_index() == 7 and r.log.term(7) == 4
    for v in (2, 3):
        r.step(Message(MT.APP_RESP, to=1, sender=v, term=4, index=6))
    assert r.log.committed == 5  # the term-2 entry at 6 is on a majority, but NOT committed
    for v in (2, 3):
        r.step(Message(MT.APP_RESP, to=1, sender=v, term=4, index=7))
    assert r.log.committed == 7  # committing the term-4 entry commits index 6 indirectly


# -- pre-vote, check-quorum, leader lease (thesis §9.6, §6.2, §4.2.3) -----------------------------


def test_prevote_stops_partitioned_node_from_disrupting() -> None:
    """Thesis §9.6: with Pre-Vote "a server would first ask whether its log was up-to-date enough to get a
    majority's vote"; a partitioned server then does not increase its term and cannot depose the leader
    when it rejoins."""
    for pre_vote, disrupted in ((True, False), (False, True)):
        net = Net([1, 2, 3], pre_vote=pre_vote, check_quorum=False)
        net.elect(1)
        term = net.raft(1).term
        net.isolate(3)
        net.propose(1, b"while-3-is-away")  # 3's log is now behind: it cannot win
        net.tick(3, 100)
        assert (net.raft(3).term > term) is disrupted
        net.recover()
        net.tick_all(30)
        assert (net.raft(1).term > term) is disrupted
        assert len(net.leaders()) == 1 and net.leaders() != [3]
        if not disrupted:
            assert net.leaders() == [1]


def test_check_quorum_leader_steps_down() -> None:
    """Thesis §6.2: "a leader steps down if an election timeout elapses without a successful round of
    heartbeats to a majority of its cluster"."""
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(1)
    # The first check after election finds everyone "recently active" (a new leader assumes so), the
    # second one, an election timeout later, finds no one.
    net.tick(1, net.raft(1).election_timeout)
    assert net.raft(1).state is StateType.LEADER
    net.tick(1, net.raft(1).election_timeout)
    assert net.raft(1).state is StateType.FOLLOWER
    net2 = Net([1, 2, 3], check_quorum=False)
    net2.elect(1)
    net2.isolate(1)
    net2.tick(1, 100)
    assert net2.raft(1).state is StateType.LEADER


def test_leader_lease_ignores_disruptive_votes() -> None:
    """Thesis §4.2.3: "if a server receives a RequestVote request within the minimum election timeout of
    hearing from a current leader, it does not update its term or grant its vote"."""
    net = Net([1, 2, 3], pre_vote=False)
    net.elect(1)
    term = net.raft(2).term
    net.deliver(Message(MT.VOTE, to=2, sender=3, term=term + 5, index=99, log_term=99))
    assert net.raft(2).term == term and net.raft(2).lead == 1


# -- leader transfer (thesis §3.10) --------------------------------------------------------------


def test_leader_transfer() -> None:
    """Thesis §3.10: "The prior leader sends its log entries to the target server ... then sends a
    TimeoutNow request to the target server ... the target server will then start an election"."""
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(3)
    net.propose(1, b"a")
    net.recover()
    net.nodes[1].transfer_leader(3)  # 3 is behind: it is caught up first
    net.flush()
    assert net.leaders() == [3]
    assert net.raft(3).term == 3
    assert net.propose(3, b"b") > 0
    assert all(net.applied[i] == [b"a", b"b"] for i in net.nodes)


def test_leader_transfer_blocks_proposals_and_times_out() -> None:
    """Thesis §3.10: "the prior leader ... stops accepting new client requests"; "if the transfer does not
    complete within about an election timeout, the prior leader aborts the transfer"."""
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(3)
    net.nodes[1].transfer_leader(3)
    net.flush()
    with pytest.raises(ProposalDroppedError):
        net.nodes[1].propose(b"x")
    net.cut -= {(1, 2), (2, 1)}
    net.tick(1, net.raft(1).election_timeout)
    assert net.leaders() == [1]
    assert net.propose(1, b"y") > 0


# -- membership changes (thesis §4.1, §4.2.2) ----------------------------------------------------


def test_add_server_one_at_a_time() -> None:
    """Thesis §4.1: "servers ... add or remove a single server at a time"; "the new configuration takes
    effect on each server as soon as it is added to that server's log"; "a leader ... cannot start
    another configuration change until the previous one is committed"."""
    net = Net([1, 2, 3])
    net.elect(1)
    net.start(4)  # empty storage: not a member, waits to be contacted
    assert not net.raft(4).promotable()
    index = net.nodes[1].propose_conf_change(ConfChange(ADD, 4))
    assert net.raft(1).log.config.current.voters == (1, 2, 3, 4)  # in force on append
    with pytest.raises(ProposalDroppedError):
        net.nodes[1].propose_conf_change(ConfChange(ADD, 5))
    net.flush()
    net.tick(1)
    assert net.raft(4).log.committed >= index
    assert all(net.raft(i).log.config.current.voters == (1, 2, 3, 4) for i in net.nodes)
    net.isolate(3)
    net.isolate(4)
    i = net.propose(1, b"needs-3-of-4")
    assert net.raft(1).log.committed < i  # majority of 4 is 3
    net.recover()
    net.tick(1)
    assert net.raft(1).log.committed >= i


def test_new_leader_waits_for_own_entry_before_conf_change() -> None:
    """The raft-dev 2015 fix to §4.1: a leader may not append a configuration entry until it has committed
    an entry from its current term."""
    net = Net([1, 2, 3])
    net.drop_types = {MT.APP_RESP}  # 1 gets no acks: its term's first entry is not committed
    net.elect(1)
    with pytest.raises(ProposalDroppedError):
        net.nodes[1].propose_conf_change(ConfChange(REMOVE, 3))
    net.recover()
    net.tick(1)
    assert net.nodes[1].propose_conf_change(ConfChange(REMOVE, 3)) > 0


def test_remove_leader_steps_down_after_commit() -> None:
    """Thesis §4.2.2: the removed leader "manages a cluster that does not include itself"; "it steps down
    once the Cnew entry is committed"."""
    net = Net([1, 2, 3])
    net.elect(1)
    net.nodes[1].propose_conf_change(ConfChange(REMOVE, 1))
    net.flush()
    net.tick(1)
    assert net.raft(1).state is StateType.FOLLOWER
    assert not net.raft(1).promotable()
    net.tick_all(40)
    leaders = net.leaders()
    assert len(leaders) == 1 and leaders[0] in (2, 3)
    assert net.propose(leaders[0], b"two-node-group") > 0


def test_uncommitted_conf_change_is_rolled_back_with_the_log() -> None:
    """Thesis §4.1: "a log entry for a configuration change can be removed (if leadership changes); in this
    case, a server must be prepared to fall back to the previous configuration in its log"."""
    net = Net([1, 2, 3, 4, 5], check_quorum=False)
    net.elect(1)
    net.start(6)
    for j in (3, 4, 5, 6):
        net.isolate(j)
    net.nodes[1].propose_conf_change(ConfChange(ADD, 6))
    net.flush()
    assert net.raft(2).log.config.current.voters == (1, 2, 3, 4, 5, 6)
    net.crash(1)
    net.recover()
    net.isolate(1)
    net.isolate(2)
    net.cut -= {(2, j) for j in (3, 4, 5)} | {(j, 2) for j in (3, 4, 5)}
    net.elect(3)  # 3, 4, 5 lack the entry; 2 votes too (3's log is as up to date by term)
    net.tick(3)
    assert net.raft(2).log.config.current.voters == (1, 2, 3, 4, 5)


# -- log compaction (§7) -------------------------------------------------------------------------


def test_snapshot_installed_on_lagging_follower() -> None:
    """§7: "the leader must occasionally send snapshots to followers that lag behind ... when it has
    already discarded the next log entry that it needs to send to a follower"."""
    net = Net([1, 2, 3])
    net.elect(1)
    net.isolate(3)
    for k in range(20):
        net.propose(1, b"v%d" % k)
    for i in (1, 2):
        st = net.storages[i]
        applied = net.raft(i).log.applied
        st.create_snapshot(applied, net.nodes[i].conf_state_at(applied), b"\n".join(net.applied[i]))
        st.compact(applied)
    net.recover()
    net.tick(1)
    assert any(m.type is MT.SNAP and m.to == 3 for m in net.delivered)
    net.propose(1, b"after")
    assert net.applied[3] == net.applied[1] == [b"v%d" % k for k in range(20)] + [b"after"]
    assert net.storages[3].first_index() > 20


# -- the persistence contract and the cost of idle groups ----------------------------------------


def test_vote_is_in_the_same_ready_as_the_vote_response() -> None:
    """Figure 2, "Persistent state on all servers: (Updated on stable storage before responding to RPCs)"."""
    node = RawNode(Config(id=2, pre_vote=False), MemoryStorage.bootstrap([1, 2, 3]))
    node.step(Message(MT.VOTE, to=2, sender=1, term=2, index=3, log_term=1))
    rd = node.ready()
    assert rd.hard_state is not None and rd.hard_state.vote == 1 and rd.hard_state.term == 2
    assert rd.must_sync and any(m.type is MT.VOTE_RESP and not m.reject for m in rd.messages)
    with pytest.raises(RuntimeError):
        node.ready()
    node.advance(rd)
    assert not node.has_ready()


def test_pipelining_respects_batch_and_inflight_limits() -> None:
    """Batching (entries per append) and pipelining (appends in flight before any answer) are bounded."""
    st = MemoryStorage.bootstrap([1, 2])
    node = RawNode(Config(id=1, pre_vote=False, max_entries_per_msg=2, max_inflight_msgs=3), st)

    def persist() -> list[Message]:
        rd = node.ready()
        st.append(rd.entries)
        if rd.hard_state is not None:
            st.set_hard_state(rd.hard_state)
        node.advance(rd)
        return rd.messages

    node.campaign()
    node.step(Message(MT.VOTE_RESP, to=1, sender=2, term=2))
    persist()
    node.step(Message(MT.APP_RESP, to=1, sender=2, term=2, index=3))  # probe answered: replicate
    persist()
    node.propose_batch([b"%d" % k for k in range(10)])
    apps = [m for m in persist() if m.type is MT.APP]
    assert [(m.index, len(m.entries)) for m in apps] == [(3, 2), (5, 2), (7, 2)]  # window of 3, 2 per message
    node.step(Message(MT.APP_RESP, to=1, sender=2, term=2, index=5))
    apps = [m for m in persist() if m.type is MT.APP]
    assert [(m.index, len(m.entries)) for m in apps] == [(9, 2)]  # one slot freed, one more batch sent


def test_idle_follower_tick_allocates_nothing() -> None:
    node = RawNode(Config(id=2, election_tick=1000), MemoryStorage.bootstrap([1, 2, 3]))
    node.step(Message(MT.HEARTBEAT, to=2, sender=1, term=2, commit=3))
    node.advance(node.ready())
    node.tick()
    before = sys.getallocatedblocks()
    for _ in range(200):
        node.tick()
        assert not node.has_ready()
    assert sys.getallocatedblocks() - before < 5
