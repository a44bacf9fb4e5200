"""Tests for hutch.core.routing: each exchange type, binding identity, and the publish-time graph walk."""

from __future__ import annotations

import random
import re
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.amqp.table import Timestamp
from hutch.core.routing import (
    NO_DESTINATIONS,
    Binding,
    DirectRouter,
    Exchange,
    FanoutRouter,
    HeadersRouter,
    InvalidBinding,
    Router,
    TopicRouter,
    UnknownExchangeType,
    exchange_dest,
    make_router,
    queue_dest,
    route,
    validate_binding,
)

# ---------------------------------------------------------------------------------------------------
# helpers

STANDARD_TYPES = ("direct", "fanout", "topic", "headers")  # the plugin types: test_routing_plugins.py


def bind(router: Router, dest: tuple[str, str], key: str = "", args: dict[str, Any] | None = None) -> bool:
    return router.add(Binding("x", dest, key, dict(args or {})))


def queues(router: Router, key: str = "", headers: dict[str, Any] | None = None) -> set[str]:
    return {name for kind, name in router.route(key, headers) if kind == "queue"}


def topic_words(key: str) -> list[str]:
    return key.split(".") if key else []


def naive_topic_match(pattern: str, key: str) -> bool:
    """Reference matcher straight from the definition (exponential in the worst case; fine for tests)."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return match(p[1:], k) or (bool(k) and match(p, k[1:]))
        return bool(k) and p[0] in ("*", k[0]) and match(p[1:], k[1:])

    return match(topic_words(pattern), topic_words(key))


def regex_topic_match(pattern: str, key: str) -> bool:
    """Second, independent reference: each word of the key becomes "." + word; fullmatch a regex."""
    parts = []
    for word in topic_words(pattern):
        if word == "#":
            parts.append(r"(?:\.[^.]*)*")
        elif word == "*":
            parts.append(r"\.[^.]*")
        else:
            parts.append(re.escape("." + word))
    subject = "".join("." + word for word in topic_words(key))
    return re.fullmatch("".join(parts), subject) is not None


def exchanges_of(*items: Exchange) -> dict[str, Exchange]:
    return {x.name: x for x in items}


def xbind(source: Exchange, dest: tuple[str, str], key: str = "", args: dict[str, Any] | None = None) -> None:
    assert source.router.add(Binding(source.name, dest, key, dict(args or {})))


# ---------------------------------------------------------------------------------------------------
# destinations, bindings, identity


def test_destination_helpers() -> None:
    assert queue_dest("q") == ("queue", "q")
    assert exchange_dest("e") == ("exchange", "e")


@pytest.mark.parametrize("exchange_type", STANDARD_TYPES)
def test_make_router_returns_a_router_of_each_type(exchange_type: str) -> None:
    router = make_router(exchange_type)
    assert isinstance(router, Router)
    assert len(router) == 0
    assert router.bindings() == []


def test_make_router_refuses_unknown_type() -> None:
    with pytest.raises(UnknownExchangeType) as info:
        make_router("x-delayed-message")
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "unknown exchange type 'x-delayed-message'"
    with pytest.raises(UnknownExchangeType):
        Exchange("/", "x", "nonsense")


@pytest.mark.parametrize("exchange_type", STANDARD_TYPES)
def test_identical_binding_is_refused_and_different_arguments_are_distinct(exchange_type: str) -> None:
    router = make_router(exchange_type)
    q = queue_dest("q")
    assert bind(router, q, "k", {"a": 1, "b": "x"})
    assert not bind(router, q, "k", {"b": "x", "a": 1})  # argument order does not matter
    assert bind(router, q, "k", {"a": True, "b": "x"})  # True is not 1
    assert bind(router, q, "k", {"a": 1.0, "b": "x"})  # nor is 1.0
    assert bind(router, q, "k2", {"a": 1, "b": "x"})
    assert bind(router, exchange_dest("q"), "k", {"a": 1, "b": "x"})
    assert len(router) == 5
    assert len(router.bindings()) == 5


@pytest.mark.parametrize("exchange_type", STANDARD_TYPES)
def test_remove_needs_the_exact_binding(exchange_type: str) -> None:
    router = make_router(exchange_type)
    q = queue_dest("q")
    bind(router, q, "k", {"a": 1})
    assert not router.remove(q, "k", {"a": True})
    assert not router.remove(q, "other", {"a": 1})
    assert not router.remove(queue_dest("nope"), "k", {"a": 1})
    assert not router.remove(exchange_dest("q"), "k", {"a": 1})
    assert router.remove(q, "k", {"a": 1})
    assert not router.remove(q, "k", {"a": 1})
    assert len(router) == 0


@pytest.mark.parametrize("exchange_type", ["direct", "fanout", "topic"])
def test_destination_stays_routed_until_its_last_binding_goes(exchange_type: str) -> None:
    router = make_router(exchange_type)
    q = queue_dest("q")
    bind(router, q, "k", {})
    bind(router, q, "k", {"x-note": "second binding, same key"})
    assert list(router.route("k", None)) == [q]  # once, not twice
    router.remove(q, "k", {})
    assert queues(router, "k") == {"q"}
    router.remove(q, "k", {"x-note": "second binding, same key"})
    assert queues(router, "k") == set()


@pytest.mark.parametrize("exchange_type", STANDARD_TYPES)
def test_remove_destination_drops_every_binding_of_that_destination(exchange_type: str) -> None:
    router = make_router(exchange_type)
    q1, q2 = queue_dest("q1"), queue_dest("q2")
    bind(router, q1, "a", {})
    bind(router, q1, "b", {"k": 1})
    bind(router, q1, "c", {"x-match": "any", "h": 1})
    bind(router, q2, "a", {})
    bind(router, exchange_dest("q1"), "a", {})  # an exchange with the same name is a different destination
    removed = router.remove_destination(q1)
    assert sorted(b.routing_key for b in removed) == ["a", "b", "c"]
    assert all(b.destination == q1 for b in removed)
    assert len(router) == 2
    assert {b.destination for b in router.bindings()} == {q2, exchange_dest("q1")}
    for key in ("a", "b", "c"):
        assert q1 not in router.route(key, {"h": 1})
    assert router.remove_destination(q1) == []


def test_properties_key_matches_rabbitmq_management() -> None:
    q = queue_dest("q")
    assert Binding("x", q, "", {}).properties_key == "~"
    assert Binding("x", q, "orders.created", {}).properties_key == "orders.created"
    assert Binding("x", q, "a b/c~d", {}).properties_key == "a+b%2Fc%7Ed"
    with_args = Binding("x", q, "k", {"a": 1, "b": "x"}).properties_key
    key, _, digest = with_args.partition("~")
    assert key == "k" and len(digest) == 6 and "~" not in digest
    assert Binding("y", queue_dest("z"), "k", {"b": "x", "a": 1}).properties_key == with_args
    assert Binding("x", q, "k", {"a": 2, "b": "x"}).properties_key != with_args
    assert Binding("x", q, "", {"a": 1}).properties_key.startswith("~")


# ---------------------------------------------------------------------------------------------------
# direct and fanout


def test_direct_exact_match() -> None:
    router = DirectRouter()
    bind(router, queue_dest("q1"), "orders")
    bind(router, queue_dest("q2"), "orders")
    bind(router, queue_dest("q3"), "orders.eu")
    bind(router, queue_dest("q4"), "")
    assert queues(router, "orders") == {"q1", "q2"}
    assert queues(router, "orders.eu") == {"q3"}
    assert queues(router, "") == {"q4"}
    assert queues(router, "Orders") == set()
    assert queues(router, "orders.*") == set()


def test_direct_route_is_a_precomputed_collection_refreshed_on_change() -> None:
    router = DirectRouter()
    bind(router, queue_dest("q1"), "k")
    first = router.route("k", None)
    assert router.route("k", None) is first  # hot path: one dict lookup, no allocation
    assert first.queues == frozenset({"q1"}) and first.exchanges == ()
    assert router.route("missing", None) is NO_DESTINATIONS
    bind(router, queue_dest("q2"), "k")
    assert queues(router, "k") == {"q1", "q2"}
    router.remove(queue_dest("q1"), "k", {})
    assert queues(router, "k") == {"q2"}
    router.remove(queue_dest("q2"), "k", {})
    assert router.route("k", None) is NO_DESTINATIONS


def test_direct_ignores_binding_arguments_when_matching() -> None:
    router = DirectRouter()
    bind(router, queue_dest("q"), "k", {"x-match": "any", "h": 1})
    assert queues(router, "k", {"h": 2}) == {"q"}


def test_fanout_routes_everything_whatever_the_key() -> None:
    router = FanoutRouter()
    assert router.route("k", None) is NO_DESTINATIONS
    bind(router, queue_dest("q1"), "ignored")
    bind(router, queue_dest("q2"))
    bind(router, exchange_dest("e"))
    for key in ("", "anything", "a.b.c"):
        assert set(router.route(key, None)) == {queue_dest("q1"), queue_dest("q2"), exchange_dest("e")}
    assert router.route("a", None) is router.route("b", None)
    router.remove(queue_dest("q1"), "ignored", {})
    assert set(router.route("k", None)) == {queue_dest("q2"), exchange_dest("e")}


# ---------------------------------------------------------------------------------------------------
# topic

TOPIC_CASES = [
    # (binding key, routing key, matches)
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("#.#", "", True),
    ("#.#", "a.b", True),
    ("*", "", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", ".", False),
    ("*.*", ".", True),  # "." is two empty words
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("a.#", "a", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b", False),
    ("a.#", "ab", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "x.a.y", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y.c", False),
    ("a.*.b", "a.b", False),
    ("a.*.b", "a.x.b", True),
    ("a.*.b", "a..b", True),
    ("a..b", "a..b", True),
    ("a..b", "a.b", False),
    ("a.", "a.", True),
    ("a.", "a", False),
    ("a.*", "a.", True),
    (".a", ".a", True),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("#.*", "a.b.c", True),
    ("#.*.#", "", False),
    ("#.*.#", "a", True),
    ("a#", "a", False),  # "#" inside a word is a literal character
    ("a#", "a#", True),
    ("a*", "ab", False),
    ("a.*", "a.*", True),  # a literal "*" word in the routing key is just a word
    ("a.b", "a.*", False),
    ("stock.#.nyse", "stock.nyse", True),
    ("stock.#.nyse", "stock.usd.eur.nyse", True),
]


@pytest.mark.parametrize(("pattern", "key", "expected"), TOPIC_CASES)
def test_topic_edge_cases(pattern: str, key: str, expected: bool) -> None:
    assert naive_topic_match(pattern, key) is expected
    assert regex_topic_match(pattern, key) is expected
    router = TopicRouter()
    bind(router, queue_dest("q"), pattern)
    assert (queues(router, key) == {"q"}) is expected


def test_topic_many_patterns_one_router() -> None:
    router = TopicRouter()
    for pattern, _, _ in TOPIC_CASES:
        bind(router, queue_dest(pattern), pattern)
    for _, key, _ in TOPIC_CASES:
        want = {p for p, _, _ in TOPIC_CASES if naive_topic_match(p, key)}
        assert queues(router, key) == want, key


def test_topic_route_cache_is_invalidated_by_add_and_remove() -> None:
    router = TopicRouter()
    bind(router, queue_dest("q1"), "a.*")
    assert queues(router, "a.b") == {"q1"}
    assert router.route("a.b", None) is router.route("a.b", None)
    bind(router, queue_dest("q2"), "#.b")
    assert queues(router, "a.b") == {"q1", "q2"}
    router.remove(queue_dest("q1"), "a.*", {})
    assert queues(router, "a.b") == {"q2"}
    router.remove_destination(queue_dest("q2"))
    assert queues(router, "a.b") == set()


def test_topic_cache_is_bounded() -> None:
    router = TopicRouter(cache_entries=8)
    bind(router, queue_dest("q"), "#")
    for i in range(100):
        assert queues(router, f"k{i}") == {"q"}
    assert len(router._cache) <= 8
    uncached = TopicRouter(cache_entries=0)
    bind(uncached, queue_dest("q"), "a.#")
    assert queues(uncached, "a.b") == {"q"} and not uncached._cache


def test_topic_trie_is_pruned_on_remove() -> None:
    router = TopicRouter()
    patterns = ["a.b.c", "a.b", "a.#", "#.c", "*.*.*", "", "a..b"]
    for i, pattern in enumerate(patterns):
        bind(router, queue_dest(f"q{i}"), pattern)
    assert router.node_count() > 0
    for i, pattern in enumerate(patterns):
        assert router.remove(queue_dest(f"q{i}"), pattern, {})
        assert queues(router, "a.b.c") == {f"q{j}" for j in range(i + 1, len(patterns))} & {
            f"q{j}" for j, p in enumerate(patterns) if naive_topic_match(p, "a.b.c")
        }
    assert router.node_count() == 0
    assert len(router) == 0


def test_topic_many_hashes_do_not_blow_up() -> None:
    router = TopicRouter(cache_entries=0)
    bind(router, queue_dest("q"), ".".join(["#"] * 20) + ".z")
    key = ".".join(["a"] * 60)
    assert queues(router, key) == set()
    assert queues(router, key + ".z") == {"q"}


_KEY_WORDS = st.sampled_from(["a", "b", ""])
_PATTERN_WORDS = st.sampled_from(["a", "b", "", "*", "#"])
_keys = st.lists(_KEY_WORDS, max_size=6).map(".".join)
_patterns = st.lists(_PATTERN_WORDS, max_size=6).map(".".join)


@settings(max_examples=200, deadline=None)  # `make test`; the 400 of the long run below are in the slow set
@given(pattern=_patterns, key=_keys)
def test_topic_property_single_binding_matches_references(pattern: str, key: str) -> None:
    expected = naive_topic_match(pattern, key)
    assert regex_topic_match(pattern, key) == expected
    router = TopicRouter()
    bind(router, queue_dest("q"), pattern)
    assert (queues(router, key) == {"q"}) == expected


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 400 examples
@settings(max_examples=400, deadline=None)
@given(pattern=_patterns, key=_keys)
def test_topic_property_single_binding_matches_references_long(pattern: str, key: str) -> None:
    test_topic_property_single_binding_matches_references.hypothesis.inner_test(pattern, key)


_operations = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["q1", "q2", "q3"]), _patterns),
    min_size=1,
    max_size=40,
)


@settings(max_examples=100, deadline=None)  # `make test`; the 200 of the long run below are in the slow set
@given(operations=_operations, keys=st.lists(_keys, min_size=1, max_size=8))
def test_topic_property_add_remove_sequence_matches_model(
    operations: list[tuple[bool, str, str]], keys: list[str]
) -> None:
    router = TopicRouter(cache_entries=4)  # small cache: exercise eviction and invalidation
    model: set[tuple[str, str]] = set()
    for is_add, queue, pattern in operations:
        if is_add:
            assert bind(router, queue_dest(queue), pattern) == ((queue, pattern) not in model)
            model.add((queue, pattern))
        else:
            assert router.remove(queue_dest(queue), pattern, {}) == ((queue, pattern) in model)
            model.discard((queue, pattern))
        for key in keys:
            want = {q for q, p in model if naive_topic_match(p, key)}
            assert queues(router, key) == want
    assert len(router) == len(model)
    for queue, pattern in list(model):
        router.remove(queue_dest(queue), pattern, {})
    assert router.node_count() == 0


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 200 examples
@settings(max_examples=200, deadline=None)
@given(operations=_operations, keys=st.lists(_keys, min_size=1, max_size=8))
def test_topic_property_add_remove_sequence_matches_model_long(
    operations: list[tuple[bool, str, str]], keys: list[str]
) -> None:
    test_topic_property_add_remove_sequence_matches_model.hypothesis.inner_test(operations, keys)


def _random_pattern(rng: random.Random, vocabulary: list[str]) -> str:
    words = []
    for position in range(rng.randint(1, 5)):
        roll = rng.random()
        wildcard_rate = 0.02 if position == 0 else 1.0
        if roll < 0.08 * wildcard_rate:
            words.append("*")
        elif roll < 0.11 * wildcard_rate:
            words.append("#")
        else:
            words.append(rng.choice(vocabulary))
    return ".".join(words)


def _instantiate(rng: random.Random, pattern: str, vocabulary: list[str]) -> str:
    """A routing key that the pattern matches (mostly), so that the big test routes somewhere."""
    words: list[str] = []
    for word in topic_words(pattern):
        if word == "*":
            words.append(rng.choice(vocabulary))
        elif word == "#":
            words.extend(rng.choice(vocabulary) for _ in range(rng.randint(0, 2)))
        else:
            words.append(word)
    return ".".join(words)


def _reference_route(buckets: dict[str | None, list[tuple[str, str]]], key: str) -> set[str]:
    """Naive matching, pruned only by the first word (a literal first word must equal the key's)."""
    words = topic_words(key)
    candidates = buckets.get("#", []) + (buckets.get("*", []) + buckets.get(words[0], []) if words else [])
    if not words:
        candidates += buckets.get(None, [])
    return {queue for queue, pattern in candidates if naive_topic_match(pattern, key)}


# `make test` binds 20,000 patterns (the same checks); the 100,000 are in the slow set (pure CPU, ~13 s here)
@pytest.mark.parametrize("bindings", [20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_topic_100k_bindings_against_reference(bindings: int) -> None:
    rng = random.Random(20240611)
    vocabulary = [f"w{i}" for i in range(200)]
    router = TopicRouter()
    buckets: dict[str | None, list[tuple[str, str]]] = {}
    patterns: list[str] = []
    for i in range(bindings):
        pattern = _random_pattern(rng, vocabulary)
        patterns.append(pattern)
        assert bind(router, queue_dest(f"q{i}"), pattern)
        first = topic_words(pattern)[0] if pattern else None
        buckets.setdefault(first, []).append((f"q{i}", pattern))
    assert len(router) == bindings
    keys = [_instantiate(rng, rng.choice(patterns), vocabulary) for _ in range(250)]
    keys += [".".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 6))) for _ in range(50)]
    routed = 0
    for key in keys:
        want = _reference_route(buckets, key)
        assert queues(router, key) == want, key
        routed += len(want)
    assert routed > 250  # the keys really reach queues

    for i in range(0, bindings, 2):  # remove half, re-check
        assert router.remove(queue_dest(f"q{i}"), patterns[i], {})
    for bucket in buckets.values():
        bucket[:] = [(q, p) for q, p in bucket if int(q[1:]) % 2]
    for key in keys[:100]:
        assert queues(router, key) == _reference_route(buckets, key), key

    for i in range(1, bindings, 2):
        assert router.remove_destination(queue_dest(f"q{i}"))
    assert len(router) == 0
    assert router.node_count() == 0


# ---------------------------------------------------------------------------------------------------
# headers

HEADERS_CASES = [
    # (binding arguments, message headers, matches)
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, None, False),
    ({"a": 1, "b": "x"}, {"a": 1}, False),  # no x-match means all
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "bogus", "a": 1, "b": "x"}, {"a": 1}, False),  # unknown x-match: all (RabbitMQ legacy)
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 1}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x", "z": 0}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, None, False),
    # no arguments left after dropping x-*: all matches everything, any matches nothing
    ({}, None, True),
    ({}, {"a": 1}, True),
    ({"x-match": "all"}, None, True),
    ({"x-match": "any"}, None, False),
    ({"x-match": "any"}, {"a": 1}, False),
    ({"x-match": "all", "x-foo": "bar"}, {}, True),
    ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
    ({"x-match": "all", "x-foo": "bar", "a": 1}, {"a": 1}, True),
    ({"x-match": "all", "a": 1}, {"a": 1, "x-foo": "other"}, True),
    # ...-with-x: x-* arguments take part (x-match itself never does)
    ({"x-match": "all-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
    ({"x-match": "all-with-x", "x-foo": "bar"}, {}, False),
    ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
    ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar", "a": 1}, True),
    ({"x-match": "all-with-x"}, None, True),
    ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, True),
    ({"x-match": "any-with-x", "x-foo": "bar", "a": 1}, {"x-foo": "baz"}, False),
    ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
    # void binding argument: presence is enough
    ({"a": None}, {"a": 5}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {"a": False}, True),
    ({"a": None}, {}, False),
    ({"a": 1}, {"a": None}, False),
    ({"x-match": "any", "a": None, "b": 1}, {"a": "anything"}, True),
    # typed comparison, as Erlang compares RabbitMQ's decoded values
    ({"a": 1}, {"a": True}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": False}, {"a": 0}, False),
    ({"a": True}, {"a": True}, True),
    ({"a": False}, {"a": False}, True),
    ({"a": 1}, {"a": 1.0}, True),  # Erlang: 1 == 1.0
    ({"a": 1_700_000_000}, {"a": Timestamp(1_700_000_000)}, True),  # a timestamp is an integer
    ({"a": "abc"}, {"a": b"abc"}, True),  # longstr and byte array are both binaries
    ({"a": "1"}, {"a": 1}, False),
    ({"a": Decimal("1.0")}, {"a": Decimal("1.0")}, True),
    ({"a": Decimal("1.0")}, {"a": Decimal("1.00")}, False),  # different (scale, value)
    ({"a": Decimal("1")}, {"a": 1}, False),
    ({"a": [1, "x"]}, {"a": [1, "x"]}, True),
    ({"a": [1]}, {"a": [True]}, False),
    ({"a": {"k": 1}}, {"a": {"k": 1}}, True),
    ({"a": {"k": 1}}, {"a": {"k": 2}}, False),
]


@pytest.mark.parametrize(("arguments", "headers", "expected"), HEADERS_CASES)
def test_headers_x_match_matrix(arguments: dict[str, Any], headers: dict[str, Any] | None, expected: bool) -> None:
    router = HeadersRouter()
    bind(router, queue_dest("q"), "ignored", arguments)
    assert (queues(router, "any-key", headers) == {"q"}) is expected
    scalars = (int, float, str, bytes, type(None))
    if all(isinstance(v, scalars) for v in [*arguments.values(), *(headers or {}).values()]):
        assert rabbitmq_headers_match(arguments, headers) is expected  # the property test's oracle agrees


def test_headers_destination_bound_twice_is_returned_once() -> None:
    router = HeadersRouter()
    bind(router, queue_dest("q"), "", {"x-match": "any", "a": 1})
    bind(router, queue_dest("q"), "", {"x-match": "any", "b": 1})
    bind(router, queue_dest("r"), "", {"x-match": "all", "a": 1, "b": 2})
    assert list(router.route("", {"a": 1, "b": 1})) == [queue_dest("q")]
    assert queues(router, "", {"a": 1, "b": 2}) == {"q", "r"}
    assert router.route("", {"c": 1}) is NO_DESTINATIONS


@pytest.mark.parametrize("x_match", ["all", "any", "all-with-x", "any-with-x"])
def test_validate_binding_accepts_known_x_match(x_match: str) -> None:
    validate_binding("headers", {"x-match": x_match, "a": 1})
    validate_binding("headers", {"a": 1})
    validate_binding("headers", None)


def test_validate_binding_refuses_bad_x_match_with_rabbitmq_text() -> None:
    with pytest.raises(InvalidBinding, match=r'^Invalid x-match field value <<"some">>; expected all, any'):
        validate_binding("headers", {"x-match": "some"})
    with pytest.raises(InvalidBinding, match=r"^Invalid x-match field type long \(value 1\); expected longstr"):
        validate_binding("headers", {"x-match": 1})
    validate_binding("direct", {"x-match": "whatever"})  # only headers exchanges look at x-match


# ---------------------------------------------------------------------------------------------------
# exchanges and route()


def test_exchange_builds_router_and_reads_alternate_exchange() -> None:
    x = Exchange("/", "x", "topic", arguments={"alternate-exchange": "ae"})
    assert isinstance(x.router, TopicRouter)
    assert x.alternate_exchange == "ae"
    assert Exchange("/", "y", "direct").alternate_exchange is None
    assert Exchange("/", "z", "fanout", arguments={"alternate-exchange": 5}).alternate_exchange is None
    x.alternate_exchange = "from-policy"  # a plain attribute a policy may overwrite
    assert x.alternate_exchange == "from-policy"


def test_default_exchange_routes_by_queue_name_without_its_router() -> None:
    default = Exchange("/", "", "direct")
    assert route({"": default}, default, ["q1"], None) == {"q1"}
    assert route({"": default}, default, ["q1", "q2", "q1"], None) == {"q1", "q2"}
    assert route({}, default, ["does-not-exist"], None) == {"does-not-exist"}  # the caller filters
    assert len(default.router) == 0


def test_route_direct_hot_path_returns_a_fresh_set() -> None:
    x = Exchange("/", "x", "direct")
    xbind(x, queue_dest("q"), "k")
    result = route(exchanges_of(x), x, ["k"], None)
    assert result == {"q"}
    result.add("mutation must not leak")
    assert route(exchanges_of(x), x, ["k"], None) == {"q"}
    assert route(exchanges_of(x), x, ["nope"], None) == set()


def test_route_follows_exchange_to_exchange_bindings() -> None:
    front = Exchange("/", "front", "topic")
    mid = Exchange("/", "mid", "direct")
    back = Exchange("/", "back", "fanout")
    xbind(front, exchange_dest("mid"), "orders.#")
    xbind(front, queue_dest("audit"), "#")
    xbind(mid, exchange_dest("back"), "orders.eu")
    xbind(mid, queue_dest("q-mid"), "orders.eu")
    xbind(back, queue_dest("q-back-1"))
    xbind(back, queue_dest("q-back-2"))
    all_x = exchanges_of(front, mid, back)
    assert route(all_x, front, ["orders.eu"], None) == {"audit", "q-mid", "q-back-1", "q-back-2"}
    assert route(all_x, front, ["orders.us"], None) == {"audit"}
    assert route(all_x, front, ["misc"], None) == {"audit"}
    del all_x["back"]  # a binding to an exchange that is gone routes nowhere
    assert route(all_x, front, ["orders.eu"], None) == {"audit", "q-mid"}


def test_route_terminates_on_exchange_binding_cycles() -> None:
    a = Exchange("/", "a", "fanout")
    b = Exchange("/", "b", "fanout")
    c = Exchange("/", "c", "topic")
    xbind(a, exchange_dest("b"))
    xbind(b, exchange_dest("a"))
    xbind(b, exchange_dest("c"))
    xbind(c, exchange_dest("a"), "#")
    xbind(c, exchange_dest("c"), "#")  # self-binding
    xbind(c, queue_dest("q"), "k")
    all_x = exchanges_of(a, b, c)
    for start in (a, b, c):
        assert route(all_x, start, ["k"], None) == {"q"}
        assert route(all_x, start, ["other"], None) == set()


def test_route_reaching_a_queue_by_several_paths_counts_it_once() -> None:
    top = Exchange("/", "top", "fanout")
    left = Exchange("/", "left", "fanout")
    right = Exchange("/", "right", "fanout")
    xbind(top, exchange_dest("left"))
    xbind(top, exchange_dest("right"))
    xbind(top, queue_dest("q"))
    xbind(left, queue_dest("q"))
    xbind(right, queue_dest("q"))
    assert route(exchanges_of(top, left, right), top, ["k"], None) == {"q"}


def test_alternate_exchange_only_when_nothing_is_routed() -> None:
    x = Exchange("/", "x", "direct", arguments={"alternate-exchange": "ae"})
    ae = Exchange("/", "ae", "fanout")
    xbind(ae, queue_dest("unrouted"))
    xbind(x, queue_dest("q"), "k")
    all_x = exchanges_of(x, ae)
    assert route(all_x, x, ["k"], None) == {"q"}
    assert route(all_x, x, ["other"], None) == {"unrouted"}
    # A destination that is an exchange counts as routed, even if that exchange routes nowhere.
    empty = Exchange("/", "empty", "direct")
    all_x["empty"] = empty
    xbind(x, exchange_dest("empty"), "to-empty")
    assert route(all_x, x, ["to-empty"], None) == set()
    # ...but that exchange's own alternate exchange applies.
    empty.alternate_exchange = "ae"
    assert route(all_x, x, ["to-empty"], None) == {"unrouted"}


def test_alternate_exchange_chain_and_cycles() -> None:
    a = Exchange("/", "a", "direct", arguments={"alternate-exchange": "b"})
    b = Exchange("/", "b", "direct", arguments={"alternate-exchange": "c"})
    c = Exchange("/", "c", "topic", arguments={"alternate-exchange": "a"})  # cycle back to a
    xbind(c, queue_dest("last-resort"), "known.#")
    xbind(b, queue_dest("b-q"), "b-key")
    all_x = exchanges_of(a, b, c)
    assert route(all_x, a, ["b-key"], None) == {"b-q"}
    assert route(all_x, a, ["known.x"], None) == {"last-resort"}
    assert route(all_x, a, ["unknown"], None) == set()  # the cycle terminates
    selfish = Exchange("/", "s", "direct", arguments={"alternate-exchange": "s"})
    assert route(exchanges_of(selfish), selfish, ["k"], None) == set()
    missing = Exchange("/", "m", "direct", arguments={"alternate-exchange": "not-declared"})
    assert route(exchanges_of(missing), missing, ["k"], None) == set()


def test_alternate_exchange_reached_through_exchange_binding_cycle() -> None:
    a = Exchange("/", "a", "fanout")
    b = Exchange("/", "b", "direct", arguments={"alternate-exchange": "a"})
    xbind(a, exchange_dest("b"))
    xbind(a, queue_dest("qa"))
    all_x = exchanges_of(a, b)
    # a routes to b and qa; b routes nowhere, its AE is a, already visited.
    assert route(all_x, a, ["k"], None) == {"qa"}
    # starting at b: nothing, so AE a, which routes to qa and back to b (already visited)
    assert route(all_x, b, ["k"], None) == {"qa"}


def test_default_exchange_as_alternate_routes_nowhere() -> None:
    default = Exchange("/", "", "direct")
    x = Exchange("/", "x", "direct", arguments={"alternate-exchange": ""})
    assert route(exchanges_of(default, x), x, ["some-queue"], None) == set()


def test_cc_and_bcc_keys_route_to_the_union() -> None:
    direct = Exchange("/", "d", "direct")
    xbind(direct, queue_dest("q1"), "k1")
    xbind(direct, queue_dest("q2"), "k2")
    xbind(direct, queue_dest("q12"), "k1")
    xbind(direct, queue_dest("q12"), "k2")
    all_x = exchanges_of(direct)
    assert route(all_x, direct, ["k1", "k2"], None) == {"q1", "q2", "q12"}
    assert route(all_x, direct, ["k1", "k1"], None) == {"q1", "q12"}
    assert route(all_x, direct, ["nope", "k2"], None) == {"q2", "q12"}

    topic = Exchange("/", "t", "topic", arguments={"alternate-exchange": "d"})
    xbind(topic, queue_dest("eu"), "*.eu")
    xbind(topic, queue_dest("us"), "*.us")
    all_x["t"] = topic
    assert route(all_x, topic, ["o.eu", "o.us"], None) == {"eu", "us"}
    # no key routes on the topic exchange: the AE gets all the keys
    assert route(all_x, topic, ["k1", "k2"], None) == {"q1", "q2", "q12"}
    assert route(all_x, topic, ["k1", "o.eu"], None) == {"eu"}


def test_cc_with_key_insensitive_exchanges() -> None:
    fanout = Exchange("/", "f", "fanout")
    headers = Exchange("/", "h", "headers")
    xbind(fanout, queue_dest("fq"))
    xbind(fanout, exchange_dest("h"))
    xbind(headers, queue_dest("hq"), "", {"x-match": "any", "a": 1})
    all_x = exchanges_of(fanout, headers)
    assert route(all_x, fanout, ["k1", "k2", "k3"], {"a": 1}) == {"fq", "hq"}
    assert route(all_x, fanout, ["k1", "k2"], {"a": 2}) == {"fq"}
    assert route(all_x, headers, ["k1", "k2"], {"a": 1}) == {"hq"}


def test_route_returns_names_of_queues_that_may_not_exist() -> None:
    x = Exchange("/", "x", "fanout")
    xbind(x, queue_dest("ghost"))
    assert route({}, x, ["k"], None) == {"ghost"}


def test_route_after_queue_deletion() -> None:
    x = Exchange("/", "x", "topic", arguments={"alternate-exchange": "ae"})
    ae = Exchange("/", "ae", "fanout")
    xbind(ae, queue_dest("fallback"))
    xbind(x, queue_dest("q"), "a.*")
    xbind(x, queue_dest("q"), "#.b")
    all_x = exchanges_of(x, ae)
    assert route(all_x, x, ["a.b"], None) == {"q"}
    assert len(x.router.remove_destination(queue_dest("q"))) == 2
    assert route(all_x, x, ["a.b"], None) == {"fallback"}


def test_bindings_lists_every_binding_once() -> None:
    router = TopicRouter()
    made = Counter()
    for i in range(20):
        for key in ("a.*", "#"):
            assert bind(router, queue_dest(f"q{i % 5}"), f"{key}.{i}")
            made[(f"q{i % 5}", f"{key}.{i}")] += 1
    listed = Counter((b.destination[1], b.routing_key) for b in router.bindings())
    assert listed == made
    assert len(router) == sum(made.values())


def _erlang_equal(pattern_value: Any, data_value: Any) -> bool:
    """Erlang `==` on the terms RabbitMQ decodes (for the scalar values the property below uses)."""
    if isinstance(pattern_value, bool) or isinstance(data_value, bool):
        return type(pattern_value) is type(data_value) and pattern_value == data_value
    if isinstance(pattern_value, (str, bytes)) and isinstance(data_value, (str, bytes)):
        as_bytes = [v.encode() if isinstance(v, str) else v for v in (pattern_value, data_value)]
        return as_bytes[0] == as_bytes[1]
    if isinstance(pattern_value, (str, bytes)) or isinstance(data_value, (str, bytes)):
        return False
    return pattern_value == data_value


def rabbitmq_headers_match(arguments: dict[str, Any], headers: dict[str, Any] | None) -> bool:
    """A port of rabbit_exchange_type_headers:headers_match/5: a merge over key-sorted tables."""
    kind = {"any": "any", "all-with-x": "all_with_x", "any-with-x": "any_with_x"}.get(arguments.get("x-match"), "all")
    pattern = sorted(arguments.items())
    data = sorted((headers or {}).items())
    all_match, any_match = True, False
    while True:
        if not all_match and kind in ("all", "all_with_x"):
            return False
        if any_match and kind in ("any", "any_with_x"):
            return True
        if not pattern:
            return all_match if kind in ("all", "all_with_x") else any_match
        pk, pv = pattern[0]
        if pk == "x-match" or (pk.startswith("x-") and kind in ("all", "any")):
            pattern = pattern[1:]
        elif not data:
            pattern, all_match = [], False
        elif pk > data[0][0]:
            data = data[1:]
        elif pk < data[0][0]:
            pattern, all_match = pattern[1:], False
        elif pv is None or _erlang_equal(pv, data[0][1]):
            pattern, data, any_match = pattern[1:], data[1:], True
        else:
            pattern, data, all_match = pattern[1:], data[1:], False


_HEADER_KEYS = st.sampled_from(["a", "b", "c", "x-a"])
_HEADER_VALUES = st.sampled_from([1, 1.0, 2, 0, True, False, "1", b"1", "v", None])
_header_tables = st.dictionaries(_HEADER_KEYS, _HEADER_VALUES, max_size=4)
_binding_arguments = st.tuples(
    st.sampled_from([None, "all", "any", "all-with-x", "any-with-x", "bogus"]), _header_tables
).map(lambda pair: ({"x-match": pair[0]} if pair[0] else {}) | pair[1])
_HEADERS_PROPERTY = {  # the property's inputs, for it and its long run
    "bindings": st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3"]), _binding_arguments), max_size=8),
    "removals": st.lists(st.integers(min_value=0, max_value=7), max_size=4),
    "messages": st.lists(st.one_of(st.none(), _header_tables), min_size=1, max_size=6),
}


@settings(max_examples=150, deadline=None)  # `make test`; the 300 of the long run below are in the slow set
@given(**_HEADERS_PROPERTY)
def test_headers_property_indexed_router_matches_rabbitmq_algorithm(
    bindings: list[tuple[str, dict[str, Any]]], removals: list[int], messages: list[dict[str, Any] | None]
) -> None:
    router = HeadersRouter()
    model: dict[tuple[str, Any], tuple[str, dict[str, Any]]] = {}
    for queue, arguments in bindings:
        added = bind(router, queue_dest(queue), "", arguments)
        assert added == ((queue, Binding("x", queue_dest(queue), "", arguments).arguments_key) not in model)
        model.setdefault((queue, Binding("x", queue_dest(queue), "", arguments).arguments_key), (queue, arguments))
    for index in removals:
        if index < len(bindings):
            queue, arguments = bindings[index]
            ident = (queue, Binding("x", queue_dest(queue), "", arguments).arguments_key)
            assert router.remove(queue_dest(queue), "", arguments) == (ident in model)
            model.pop(ident, None)
    for headers in messages:
        want = {queue for queue, arguments in model.values() if rabbitmq_headers_match(arguments, headers)}
        assert queues(router, "", headers) == want, (headers, list(model.values()))
    for queue, arguments in list(model.values()):
        router.remove(queue_dest(queue), "", arguments)
    assert not router._by_key and not router._by_item and not router._always and not router._key_uses


@pytest.mark.slow  # the long run (`make test-slow`): the same test, 300 examples
@settings(max_examples=300, deadline=None)
@given(**_HEADERS_PROPERTY)
def test_headers_property_indexed_router_matches_rabbitmq_algorithm_long(
    bindings: list[tuple[str, dict[str, Any]]], removals: list[int], messages: list[dict[str, Any] | None]
) -> None:
    test_headers_property_indexed_router_matches_rabbitmq_algorithm.hypothesis.inner_test(bindings, removals, messages)


def test_binding_tolerates_absent_arguments() -> None:
    router = HeadersRouter()
    binding = Binding("x", queue_dest("q"), "", None)  # type: ignore[arg-type]
    assert binding.arguments == {} and router.add(binding)
    assert queues(router, "", None) == {"q"}  # no arguments: x-match all with nothing to check
    assert router.remove(queue_dest("q"), "", None)


def test_large_unreferenced_headers_do_not_matter() -> None:
    router = HeadersRouter()
    bind(router, queue_dest("q"), "", {"tenant": "t1"})
    x_death = [{"count": 1, "reason": "expired", "queue": f"q{i}", "routing-keys": ["k"]} for i in range(50)]
    assert queues(router, "", {"tenant": "t1", "x-death": x_death}) == {"q"}
    assert queues(router, "", {"tenant": "t2", "x-death": x_death}) == set()


# ---------------------------------------------------------------------------------------------------
# benchmark (docs/routing.md quotes it): .venv/bin/python -m pytest -m slow -s tests/unit/test_routing.py


def _per_call_ns(fn: Any, calls: int) -> float:
    import timeit

    return min(timeit.repeat(fn, number=calls, repeat=5)) / calls * 1e9


@pytest.mark.slow
def test_routing_benchmark() -> None:
    xs: dict[str, Exchange] = {}
    d = xs["d"] = Exchange("/", "d", "direct")
    for i in range(10_000):
        xbind(d, queue_dest(f"q{i}"), f"k{i}")
    f = xs["f"] = Exchange("/", "f", "fanout")
    for i in range(10):
        xbind(f, queue_dest(f"f{i}"))
    e = xs["e"] = Exchange("/", "e", "fanout")
    xbind(e, exchange_dest("d"))
    lines = [
        ("direct, 10k keys: route()", _per_call_ns(lambda: route(xs, d, ("k5",), None), 200_000)),
        ("direct: router.route()", _per_call_ns(lambda: d.router.route("k5", None), 200_000)),
        ("fanout, 10 queues: route()", _per_call_ns(lambda: route(xs, f, ("x",), None), 200_000)),
        ("fanout -> direct (e2e): route()", _per_call_ns(lambda: route(xs, e, ("k5",), None), 200_000)),
    ]
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(1000)]
    keys = [".".join(rng.choice(vocabulary) for _ in range(3)) for _ in range(2000)]
    for n_bindings in (100, 100_000):
        for cache in (0, 4096):
            router = TopicRouter(cache_entries=cache)
            for i in range(n_bindings):
                if rng.random() < 0.01:
                    pattern = f"#.{rng.choice(vocabulary)}"
                else:
                    pattern = f"{rng.choice(vocabulary)}.{rng.choice(vocabulary)}.{rng.choice(vocabulary + ['*'] * 100)}"
                bind(router, queue_dest(f"q{i}"), pattern)
            keys_routed = keys[:100] if cache else keys
            ns = _per_call_ns(lambda r=router, ks=keys_routed: [r.route(k, None) for k in ks], 5) / len(keys_routed)
            label = "100 repeated keys, cache on" if cache else "2000 distinct keys, cache off"
            lines.append((f"topic, {n_bindings} bindings, {label}: router.route()", ns))
    # The comparison: a linear scan with one precompiled regex per binding (what a trie avoids).
    compiled = [re.compile(re.escape(f"w{i}.w{i + 1}.") + r"[^.]*") for i in range(1000)]
    scan_ns = _per_call_ns(lambda: [c for c in compiled if c.fullmatch(keys[0])], 200)
    lines.append(("linear regex scan, 1000 bindings (the baseline a trie avoids)", scan_ns))
    for n_bindings in (100, 10_000):
        h = Exchange("/", "h", "headers")
        for i in range(n_bindings):
            xbind(h, queue_dest(f"h{i}"), "", {"x-match": "all", "type": f"t{i}", "region": "eu"})
        message_headers = {"type": "t7", "region": "eu"}
        ns = _per_call_ns(lambda h=h, m=message_headers: route(xs, h, ("",), m), 20_000)
        lines.append((f"headers, {n_bindings} bindings: route()", ns))
    for label, ns in lines:
        print(f"{label:<72} {ns:>7.0f} ns")
