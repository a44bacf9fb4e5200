"""A Jepsen-style run of a replicated stream, in one process (tests/streams/stream_world.py: three nodes,
each a Raft driver hosting the coordinator's group and a `ReplicatedStream` over a real `StreamHandle` on
its own MemoryFS). Publishers append through whichever member believes it writes (an isolated old writer
too: its publishes must never be confirmed wrongly); one seed picks the faults: `kill -9` of a node (its
unsynced bytes lost), restarts, a node isolated from the others, healing, a fourth node added and a
member removed (and later added back with its stale files); a failure detector proposes a
new election when the writer's node is gone. After healing: every confirmed record is in the stream, in
order, once, on every member.

`make test` runs one seed; the slow set runs more. Replay one: `HUTCH_STREAM_JEPSEN_SEED=N pytest
tests/streams/test_stream_jepsen.py -k replay`.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from tests.streams.stream_world import GID, IDS, World, records
from tests.streams.test_replicated_stream import until

from hutch.cluster import stream_coordinator as sc
from hutch.cluster import stream_replica as sr
from hutch.runtime.clustering.raft_group import GroupClosed, NotLeader, ProposalTimeout
from hutch.runtime.queue_types.stream.handle import Appended
from hutch.runtime.queue_types.stream_replication.member import NotWriter
from hutch.storage.errors import StorageError

pytestmark = pytest.mark.asyncio


class History:
    """What the publishers were told: the records confirmed, and how many publishes there were."""

    def __init__(self) -> None:
        self.confirmed: set[bytes] = set()
        self.published = 0
        self.failed = 0

    def watch(self, appended: Appended, payloads: list[bytes]) -> None:
        def done(fut: asyncio.Future[None]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self.failed += 1
            else:
                self.confirmed.update(payloads)
        appended.settled.add_done_callback(done)


async def change_members(w: World, rng: random.Random) -> bool:
    """Add the node that is not a member (booting it the first time), or remove a random member (which
    then closes the stream and stays up, ready to be added again: its stale files are cut or reset)."""
    state = w.state()
    leader = w.leader()
    if leader is None or leader.service is None or not state.stable:
        return False
    outside = [n for n in w.nodes.values() if n.name not in state.members]
    try:
        if len(state.members) == 3 and outside:
            node = outside[0]
            if not node.up:
                await w.boot_spare()
            elif node.hosted is None and node.service is not None:
                node.hosted = node.service.attach(GID, state.members, "/s", founding=False)
            await leader.service.add_member(GID, node.name, timeout_s=3.0)
        elif len(state.members) == 4:
            gone = rng.choice(state.members)
            await leader.service.delete_member(GID, gone, timeout_s=3.0)
            node = w.nodes[IDS[gone]]
            await until(lambda: gone not in w.state().members, "the member removed", 5.0)
            if node.service is not None:
                await node.service.detach(GID, delete=True)
            node.hosted = None
        return True
    except (NotLeader, ProposalTimeout, GroupClosed, sc.CoordinatorError, AssertionError):
        return False


async def run(tmp: Path, seed: int, steps: int) -> dict[str, int]:
    rng = random.Random(seed)
    w = World(tmp, spare=True)
    await w.start()
    await until(lambda: w.state().stable, "the first epoch stable")
    history = History()
    counts = {"kills": 0, "restarts": 0, "isolations": 0, "elections": 0, "member_changes": 0}
    next_id = 0
    down_since: int | None = None
    try:
        for step in range(steps):
            # publish through any member that believes it writes
            writers = [n for n in w.nodes.values() if n.stream is not None and not n.stream.closed
                       and n.stream.member.role is sr.Role.WRITER]
            if writers:
                node = rng.choice(writers)
                assert node.stream is not None
                payloads = [b"%08d" % (next_id + i) for i in range(rng.randint(1, 3))]
                next_id += len(payloads)
                try:
                    history.watch(node.stream.publish(payloads), payloads)
                    history.published += len(payloads)
                except NotWriter:
                    pass
            # faults
            r = rng.random()
            members = w.state().members
            live = [n for n in w.nodes.values() if n.up and n.name in members]
            dead = [n for n in w.nodes.values() if not n.up and n.hosted is not None]
            whole = len(live) == len(members) and not w.isolated
            if r < 0.04 and whole:
                w.kill(rng.choice(live))
                counts["kills"] += 1
            elif r < 0.07 and dead:
                if await w.restart(rng.choice(dead)):
                    counts["restarts"] += 1
            elif r < 0.09 and whole:
                w.isolate(rng.choice(live))
                counts["isolations"] += 1
            elif r < 0.13 and w.isolated:
                w.heal()
            elif r < 0.15 and whole and await change_members(w, rng):
                counts["member_changes"] += 1
            # the failure detector: the writer's node gone (or cut off) for a while
            state = w.state()
            writer = w.nodes[IDS[state.writer]] if state.writer else None
            if writer is not None and not writer.reachable:
                down_since = step if down_since is None else down_since
                if step - down_since >= 5:
                    before = state.epoch
                    await w.propose(sc.WriterDown(state.epoch))
                    if w.state().epoch > before:
                        counts["elections"] += 1
                    down_since = None
            else:
                down_since = None
            await asyncio.sleep(0.01)
        # heal everything and let it settle
        w.heal()
        for node in [n for n in w.nodes.values() if not n.up and n.hosted is not None]:
            assert await w.restart(node, timeout_s=20.0), f"{node.name} could not restart"
        final = await w.writing(30)
        for attempt in range(3):
            try:
                await asyncio.wait_for(final.publish([b"final"]).settled, 30)
                break
            except (StorageError, NotWriter) as exc:
                # a view change still under way after healing (the member was fenced and cut, failing
                # what it had not committed): not a violation, as long as a later writer confirms
                print(f"seed {seed}: the final publish was refused ({exc}); again\n{w.describe()}")
                if attempt == 2:
                    raise AssertionError(f"seed {seed}: no final publish confirmed\n{w.describe()}") from exc
                final = await w.writing(30)
            except TimeoutError as exc:
                raise AssertionError(f"seed {seed}: the last publish not confirmed after healing\n{w.describe()}") from exc
        history.confirmed.add(b"final")

        def settled() -> bool:
            members = [w.nodes[IDS[m]] for m in w.state().members]
            logs = [records(n.stream) for n in members if n.stream is not None]
            return len(logs) == len(members) and all(log == logs[0] for log in logs) \
                and logs[0][-1:] == [b"final"]
        try:
            await until(settled, "every member holding the same log", 30)
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}: {exc}\n{w.describe()}") from exc
        log = records(final)
        assert len(log) == len(set(log)), "a record twice"
        assert log == sorted(log), "records out of order"
        missing = history.confirmed - set(log)
        assert not missing, f"confirmed records lost: {sorted(missing)[:10]}"
        counts["confirmed"] = len(history.confirmed)
        counts["published"] = history.published
        return counts
    finally:
        await w.stop()


async def test_one_seed(tmp_path: Path) -> None:
    counts = await run(tmp_path, seed=4, steps=300)
    assert counts["confirmed"] > 50
    assert counts["kills"] + counts["isolations"] > 0, counts


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
async def test_seeds(tmp_path: Path, seed: int) -> None:
    await run(tmp_path, seed=100 + seed, steps=600)


async def test_replay(tmp_path: Path) -> None:
    seed = os.environ.get("HUTCH_STREAM_JEPSEN_SEED")
    if seed is None:
        pytest.skip("set HUTCH_STREAM_JEPSEN_SEED=N to replay a seed")
    print(await run(tmp_path, seed=int(seed), steps=600))
