"""Groups of the definitions log (runtime/broker/definitions.py, "Groups"): a group's operations count
at load only if its end marker is in the log, wherever other changes' syncs put them on disk, and a
crash (MemoryFS's power cut, unsynced tails torn at random) never leaves part of a group."""

from __future__ import annotations

import random

import pytest

from hutch.amqp.table import encode_table
from hutch.core import definition_ops as d
from hutch.runtime.broker.definitions import DefinitionStore, ended_groups_only
from hutch.storage.memfs import MemoryFS

DATA = "/data"
NO_ARGS = encode_table({})


def part(i: int) -> d.DefinitionOp:
    return d.Bind("/", "ss", "queue", f"ss-{i}", str(i), NO_ARGS)


def other(i: int) -> d.DefinitionOp:
    return d.DeleteQueue("/", f"other-{i}")


def test_only_ended_groups_count_and_their_tags_are_stripped() -> None:
    stored = [{"op": "a", "group": 1}, {"op": "b"}, {"op": "c", "group": 2}, {"op": "group.end", "group": 1}]
    assert ended_groups_only(stored) == [{"op": "a"}, {"op": "b"}]


def test_a_group_without_its_end_loads_nothing_though_other_syncs_wrote_it() -> None:
    fs = MemoryFS()
    store = DefinitionStore(DATA, fs)
    store.append(part(0), group=7)
    store.append(other(0))  # synced: writes the group's entry too
    store.append(part(1), group=7)
    syncs = fs.stats.syncs
    store.end_group(7)
    assert fs.stats.syncs == syncs + 1  # the group's one sync
    store.append(part(2), group=8)
    store.append(other(1))
    fs.crash(torn=False)
    assert DefinitionStore(DATA, fs).load() == [part(0), other(0), part(1), other(1)]


@pytest.mark.parametrize("seed", range(30))
def test_a_crash_anywhere_keeps_a_group_whole_or_drops_it(seed: int) -> None:
    rng = random.Random(seed)
    fs = MemoryFS(seed=seed)
    store = DefinitionStore(DATA, fs)
    durable: list[d.DefinitionOp] = []  # what a load must return at least (in order, synced)
    members = [part(i) for i in range(rng.randint(1, 6))]
    ended = False
    for i, op in enumerate(members):
        store.append(op, group=3)
        if rng.random() < 0.4:
            store.append(other(i))
            durable.append(other(i))
    if rng.random() < 0.5:
        store.end_group(3)
        ended = True
    fs.crash(torn=True)
    loaded = DefinitionStore(DATA, fs).load()
    got_members = [op for op in loaded if op in members]
    assert got_members == (members if ended else [])
    assert [op for op in loaded if op not in members] == durable
