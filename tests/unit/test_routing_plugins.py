"""The plugin exchange types' routers (pure): RabbitMQ's exact consistent-hash ring, random, local-random.

The golden values were taken by hand: `erlang:phash2/1` and `rand` from Erlang/OTP 25 (`erl -noshell`),
and which queue each key reached on RabbitMQ 3.10.8 with the consistent-hash plugin (docs/routing.md,
"Plugin exchange types", says how).
"""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chx_golden import AFTER_UNBIND_Q2, HEADER_3_10, MESSAGE_ID, ROUTING_KEY_TO_QUEUE, TIMESTAMP, WEIGHTS
from hutch.amqp.table import Timestamp
from hutch.core.routing import (
    Binding,
    ConsistentHashRouter,
    Exchange,
    InvalidBinding,
    InvalidExchange,
    LocalRandomRouter,
    RandomRouter,
    UnknownExchangeType,
    exchange_dest,
    queue_dest,
    route,
    validate_binding,
    validate_exchange,
)
from hutch.core.routing.erlhash import UNDEFINED, Atom, Exs1024, jump_consistent_hash, phash2

# erlang:phash2/1 on OTP 25
PHASH2 = [
    (b"a", 112802447), (b"", 13708901), (b"hello world 123456", 23425052), (UNDEFINED, 45914356),
    (True, 506293), ([], 113427502), (12345, 65065628), (-5, 115015680), (1 << 40, 13893919),
    (-(1 << 40), 48180921), (1 << 62, 29238129), (1.5, 10380315), ((Atom("longstr"), b"x"), 14442427),
    ((1, 2), 91564110), ([1, 2, 3], 25788620), ([1, 2, 3, 4, 5], 66056394), ([Atom("a"), b"b", 300], 67033404),
    (1 << 70, 131422029), (-(1 << 70), 20532417), (bytes(range(1, 41)), 119442385), (134217727, 112602999),
    (134217728, 12354923), (-134217728, 69672967), (-134217729, 76739502),
]

# [jump_consistent_hash(integer_to_binary(I), N) || I <- 1..30, N <- [3, 7, 100, 10000]] on OTP 25
JUMP = [
    2, 2, 76, 7707, 2, 5, 12, 8725, 2, 2, 87, 8460, 0, 0, 30, 6543, 0, 0, 26, 6535, 0, 3, 23, 1541, 2, 2,
    97, 869, 1, 6, 59, 7640, 0, 6, 31, 3039, 2, 2, 43, 7599, 2, 3, 78, 8265, 1, 1, 19, 8805, 2, 6, 6,
    3993, 1, 3, 74, 8655, 0, 5, 89, 7168, 0, 0, 16, 7467, 2, 2, 80, 7634, 2, 2, 72, 4920, 2, 2, 95, 2541,
    1, 1, 1, 6973, 0, 0, 24, 5565, 2, 2, 46, 2623, 2, 2, 25, 8146, 1, 3, 47, 4195, 1, 3, 82, 9056, 1, 5,
    33, 8984, 0, 3, 90, 3759, 1, 5, 46, 8975, 2, 2, 41, 569, 1, 4, 7, 4432,
]

def ring(arguments: dict | None = None, weights: list[tuple[str, int]] = WEIGHTS) -> ConsistentHashRouter:
    router = ConsistentHashRouter()
    router.configure(arguments or {})
    for name, weight in weights:
        assert router.add(Binding("x", queue_dest(name), str(weight), {}))
    return router


def only(result: object) -> str:
    (kind, name), = result  # type: ignore[misc]
    assert kind == "queue"
    return name


def with_properties(**properties: object) -> SimpleNamespace:
    return SimpleNamespace(properties=SimpleNamespace(**properties))


@pytest.mark.parametrize(("term", "expected"), PHASH2)
def test_phash2_is_the_erlang_vms(term: object, expected: int) -> None:
    assert phash2(term) == expected


def test_exs1024_draws_what_rand_uniform_s_draws() -> None:
    rng = Exs1024(7, 7, 7)
    assert (rng.uniform(), rng.uniform()) == (0.37838308512588215, 0.988503089017669)
    rng = Exs1024(99, 99, 99)
    draws = [rng.uniform() for _ in range(40)]  # past the 16-word state's wrap
    assert (draws[0], draws[-1]) == (0.39773385431333436, 0.6976597485665523)


def test_jump_consistent_hash_is_rabbitmqs() -> None:
    got = [jump_consistent_hash(str(i).encode(), n) for i in range(1, 31) for n in (3, 7, 100, 10000)]
    assert got == JUMP
    assert jump_consistent_hash(b"anything", 1) == 0
    assert jump_consistent_hash([b"first", b"cc"], 100) == jump_consistent_hash(b"first", 100)
    assert jump_consistent_hash(7, 50) == jump_consistent_hash([7], 50)  # integers seed as they are


def test_routing_key_lands_where_rabbitmq_puts_it() -> None:
    router = ring()
    assert router.buckets == 21
    for key, queue in ROUTING_KEY_TO_QUEUE.items():
        assert only(router.route(key, None)) == f"q{queue}", key
    router.remove(queue_dest("q2"), "5", {})
    assert router.buckets == 16
    for key, queue in AFTER_UNBIND_Q2.items():
        assert only(router.route(key, None)) == f"q{queue}", key


def test_hash_property_lands_where_rabbitmq_puts_it() -> None:
    by_id = ring({"hash-property": "message_id"})
    for message_id, queue in MESSAGE_ID.items():
        assert only(by_id.route("ignored", None, with_properties(message_id=message_id))) == f"q{queue}"
    by_time = ring({"hash-property": "timestamp"})
    for seconds, queue in TIMESTAMP.items():
        assert only(by_time.route("", None, with_properties(timestamp=Timestamp(seconds)))) == f"q{queue}"
    assert by_id.route("", None, with_properties(message_id=None)) == by_id.route("", None, None)


def test_hash_header_follows_rabbitmq_4_and_3_10_differs_only_by_its_type_tag() -> None:
    router = ring({"hash-header": "hk"})
    for value, queue in HEADER_3_10.items():
        assert router.choose((Atom("longstr"), value.encode())) == queue_dest(f"q{queue}")
        assert router.route("", {"hk": value}) == router.route("", {"hk": value.encode()})
        assert only(router.route("", {"hk": value})) == only([router.choose(value.encode())])
    assert only(router.route("", {})) == "q1"  # an absent header hashes `undefined`, as on 3.10.8
    assert router.route("", None) == router.route("", {"hk": None})
    assert router.route("", {"hk": 7}) == {router.choose(7)}
    assert router.route("", {"hk": []}) == {router.choose(phash2([]))}


def test_the_result_cache_is_bounded_and_gives_the_same_answers() -> None:
    cached, uncached = ring(), ring()
    cached.cache_entries = 8
    uncached.cache_entries = 0
    for _ in range(3):
        for i in range(50):
            assert cached.route(f"k{i}", None) == uncached.route(f"k{i}", None)
    assert len(cached._cache) == 8 and not uncached._cache


def test_weights_give_the_proportions() -> None:
    router = ring(weights=[("light", 1), ("middle", 3), ("heavy", 6)])
    counts = Counter(only(router.route(f"order-{i}", None)) for i in range(20_000))
    for name, share in (("light", 0.1), ("middle", 0.3), ("heavy", 0.6)):
        assert abs(counts[name] / 20_000 - share) < 0.02, counts


def test_a_second_binding_to_the_same_queue_keeps_the_first_weight() -> None:
    router = ring(weights=[("a", 2), ("b", 3)])
    assert router.add(Binding("x", queue_dest("a"), "9", {}))
    assert router.buckets == 5 and len(router) == 3
    assert router.remove(queue_dest("a"), "2", {})
    assert router.ring() == [(0, queue_dest("b")), (3, queue_dest("a"))]  # the other binding, at the end
    assert router.buckets == 12
    assert len(router.remove_destination(queue_dest("a"))) == 1
    assert router.ring() == [(0, queue_dest("b"))]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 20)), max_size=40))
def test_ring_matches_rabbitmqs_bucket_map(ops: list[tuple[bool, int, int]]) -> None:
    """Against a port of chx_hash_ring_update_fun / ch_hash_ring_delete_fun (one binding per queue)."""
    router = ConsistentHashRouter()
    buckets: dict[int, str] = {}
    weights: dict[str, int] = {}
    for adding, q, weight in ops:
        name = f"q{q}"
        if adding and name not in weights:
            start = len(buckets)
            buckets.update({start + i: name for i in range(weight)})
            weights[name] = weight
            router.add(Binding("x", queue_dest(name), str(weight), {}))
        elif not adding and name in weights:
            mine = sorted(k for k, v in buckets.items() if v == name)
            buckets = {(k if k < mine[0] else k - len(mine)): v for k, v in buckets.items() if v != name}
            router.remove(queue_dest(name), str(weights.pop(name)), {})
        assert router.buckets == len(buckets)
        for key in ("a", "b", "order-1"):  # after every change: the result cache never serves a stale ring
            expected = buckets[jump_consistent_hash(key.encode(), len(buckets))] if buckets else None
            assert (only(router.route(key, None)) if buckets else None) == expected


@pytest.mark.parametrize(("key", "text"), [
    ("abc", 'The binding key must be an integer: <<"abc">>'),
    ("", 'The binding key must be an integer: <<"">>'),
    ("1.5", 'The binding key must be an integer: <<"1.5">>'),
    ("0", "The binding key must be greater than 0"),
    ("-3", "The binding key must be greater than 0"),
    ("10001", "The binding key must not exceed 10000"),
])
def test_consistent_hash_binding_keys_are_checked(key: str, text: str) -> None:
    with pytest.raises(InvalidBinding, match="^" + text.replace("(", r"\(") + "$"):
        validate_binding("x-consistent-hash", {}, key)
    validate_binding("x-consistent-hash", {}, "+10000")


@pytest.mark.parametrize(("type_", "arguments", "text"), [
    ("x-consistent-hash", {"hash-header": "a", "hash-property": "message_id"},
     "hash-header and hash-property are mutually exclusive"),
    ("x-consistent-hash", {"hash-property": "priority"}, "Unsupported property: priority"),
    ("x-consistent-hash", {"hash-header": 5}, "Invalid argument, 'hash-header' must be a string"),
    ("x-delayed-message", {}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ("x-delayed-message", {"x-delayed-type": "nope"},
     "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
    ("x-delayed-message", {"x-delayed-type": "x-delayed-message"},
     "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"),
    ("x-delayed-message", {"x-delayed-type": "x-consistent-hash", "hash-property": "nope"},
     "Unsupported property: nope"),
])
def test_exchange_arguments_are_checked(type_: str, arguments: dict, text: str) -> None:
    with pytest.raises(InvalidExchange) as info:
        validate_exchange(type_, arguments)
    assert str(info.value) == text


def test_known_types_validate_and_unknown_ones_do_not() -> None:
    for type_ in ("x-random", "x-local-random", "x-consistent-hash", "direct"):
        validate_exchange(type_, {})
    validate_exchange("x-delayed-message", {"x-delayed-type": "topic"})
    with pytest.raises(UnknownExchangeType):
        validate_exchange("x-jms-topic", {})


def test_delayed_exchange_routes_with_its_inner_type() -> None:
    x = Exchange("/", "later", "x-delayed-message", arguments={"x-delayed-type": "topic"})
    x.router.add(Binding("later", queue_dest("q"), "a.*", {}))
    assert route({"later": x}, x, ["a.b"], None) == {"q"}
    assert route({"later": x}, x, ["b.b"], None) == set()


def test_random_picks_one_binding_uniformly() -> None:
    router = RandomRouter()
    router.rng = random.Random(1)
    assert router.route("k", None) == set()
    for name in ("a", "b", "c"):
        router.add(Binding("x", queue_dest(name), "", {}))
    router.add(Binding("x", exchange_dest("e"), "", {}))
    counts = Counter(next(iter(router.route(str(i), None))) for i in range(8000))
    assert set(counts) == {queue_dest("a"), queue_dest("b"), queue_dest("c"), exchange_dest("e")}
    assert all(abs(n / 8000 - 0.25) < 0.03 for n in counts.values()), counts
    router.remove(queue_dest("b"), "", {})
    router.remove_destination(exchange_dest("e"))
    assert {next(iter(router.route("", None))) for _ in range(200)} == {queue_dest("a"), queue_dest("c")}


def test_local_random_picks_among_local_queues_only() -> None:
    router = LocalRandomRouter()
    router.rng = random.Random(2)
    for name in ("here-1", "here-2", "there"):
        router.add(Binding("x", queue_dest(name), "", {}))
    router.is_local = lambda name: name.startswith("here")
    picked = Counter(only(router.route("", None)) for _ in range(2000))
    assert set(picked) == {"here-1", "here-2"} and min(picked.values()) > 800
    router.is_local = lambda name: name == "there"
    assert only(router.route("", None)) == "there"
    router.is_local = lambda name: False
    assert router.route("", None) == set()


def test_local_random_refuses_a_binding_key() -> None:
    with pytest.raises(InvalidBinding, match="^Non empty binding 'k' key not permitted$"):
        validate_binding("x-local-random", {}, "k")
    validate_binding("x-local-random", {}, "")


def test_plugin_routers_ignore_cc_keys_after_the_first() -> None:
    x = Exchange("/", "h", "x-consistent-hash")
    for name, weight in WEIGHTS:
        x.router.add(Binding("h", queue_dest(name), str(weight), {}))
    assert route({"h": x}, x, ["key-5", "key-0", "key-10"], None) == {"q2"}


def test_a_walk_stops_at_a_delayed_exchange_when_the_message_asks_for_a_delay() -> None:
    front = Exchange("/", "front", "direct")
    later = Exchange("/", "later", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    spare = Exchange("/", "spare", "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    nowhere = Exchange("/", "nowhere", "direct")
    nowhere.alternate_exchange = "spare"
    exchanges = {x.name: x for x in (front, later, spare, nowhere)}
    front.router.add(Binding("front", exchange_dest("later"), "k", {}))
    front.router.add(Binding("front", queue_dest("direct-q"), "k", {}))
    later.router.add(Binding("later", queue_dest("q"), "", {}))
    spare.router.add(Binding("spare", queue_dest("spare-q"), "", {}))
    held: list[Exchange] = []
    assert route(exchanges, front, ["k"], {"x-delay": 500}, None, held) == {"direct-q"}
    assert held == [later]
    held.clear()
    assert route(exchanges, front, ["k"], {"x-delay": -500}, None, held) == {"direct-q", "q"}  # released
    assert route(exchanges, front, ["k"], None, None, held) == {"direct-q", "q"} and held == []
    assert route(exchanges, nowhere, ["k"], {"x-delay": "20"}, None, held) == set() and held == [spare]
    assert route(exchanges, front, ["k"], {"x-delay": 500}) == {"direct-q", "q"}  # no `held`: routed through
