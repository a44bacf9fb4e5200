"""Tests for hutch.core.policy: validation, matching and priorities, the store, and the precedence of
x-arguments, policies and operator policies (examples and Hypothesis properties)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hutch.core.policy import (
    EXCHANGE,
    NUMERIC_KEYS,
    OPERATOR_POLICY_KEYS,
    QUEUE,
    Policy,
    PolicyError,
    PolicyStore,
    effective_settings,
    exchange_alternate,
    make_policy,
    merged_definition,
    select,
)
from hutch.core.queue_settings import POLICY_FIELDS, QueueSettings, settings_from_arguments


def pol(name: str = "p", pattern: str = ".*", definition: dict[str, Any] | None = None, priority: Any = 0,
        apply_to: str = "all", vhost: str = "/", operator: bool = False) -> Policy:
    definition = {"max-length": 10} if definition is None else definition
    return make_policy(vhost, name, pattern, definition, priority, apply_to, operator=operator)


# -- validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize("definition", [
    {"message-ttl": 0}, {"expires": 1}, {"max-length": 0}, {"max-length-bytes": 2**63 - 1},
    {"message-ttl": 315_360_000_000}, {"expires": 315_360_000_000},
    {"overflow": "drop-head"}, {"overflow": "reject-publish"}, {"overflow": "reject-publish-dlx"},
    {"dead-letter-exchange": ""}, {"dead-letter-routing-key": "rk"}, {"delivery-limit": 0},
    {"alternate-exchange": "ae"}, {"queue-leader-locator": "client-local"}, {"queue-leader-locator": "balanced"},
    {"message-ttl": 5, "max-length": 3, "dead-letter-exchange": "dlx"},
])
def test_valid_definitions(definition):
    p = pol(definition=definition)
    assert p.definition == definition
    assert p.definition is not definition  # a copy


@pytest.mark.parametrize(("definition", "text"), [
    ({"message-ttl": -1}, "Validation failed: -1 is not a valid message TTL"),
    ({"message-ttl": 1.5}, "1.5 is not a valid message TTL"),
    ({"message-ttl": "10"}, '"10" is not a valid message TTL'),
    ({"message-ttl": True}, "true is not a valid message TTL"),
    ({"expires": 0}, "0 is not a valid queue expiry"),
    ({"expires": 315_360_000_001}, "315360000001 is not a valid queue expiry"),
    ({"message-ttl": 315_360_000_001}, "315360000001 is not a valid message TTL"),
    ({"max-length": 2**63}, "9223372036854775808 is not a valid maximum length"),
    ({"max-length": -1}, "-1 is not a valid maximum length"),
    ({"max-length-bytes": None}, "null is not a valid maximum length in bytes"),
    ({"overflow": "drop-tail"}, '"drop-tail" is not a valid overflow value'),
    ({"dead-letter-exchange": 1}, "1 is not a valid dead letter exchange name"),
    ({"dead-letter-routing-key": []}, "[] is not a valid dead letter routing key"),
    ({"delivery-limit": -5}, "-5 is not a valid delivery limit"),
    ({"alternate-exchange": {}}, "{} is not a valid alternate exchange name"),
    ({"queue-leader-locator": "nearest"}, '"nearest" is not a valid queue leader locator value'),
    ({"ha-mode": "all"}, 'Validation failed: ["ha-mode"] are not recognised policy settings'),
    ({}, "Validation failed: no policy provided"),
])
def test_invalid_definitions(definition, text):
    with pytest.raises(PolicyError) as info:
        pol(definition=definition)
    assert text in str(info.value)
    assert "\n" not in str(info.value)


def test_definition_must_be_an_object():
    with pytest.raises(PolicyError, match="definition must be a dictionary"):
        make_policy("/", "p", ".*", [["max-length", 1]])


def test_operator_policy_keys():
    for key in OPERATOR_POLICY_KEYS:
        value = {"overflow": "reject-publish", "dead-letter-strategy": "at-least-once"}.get(key, 7)
        assert pol(definition={key: value}, operator=True).definition == {key: value}
    for key in ("dead-letter-exchange", "alternate-exchange", "queue-leader-locator", "dead-letter-routing-key"):
        with pytest.raises(PolicyError, match=f'"{key}"\\] are not recognised operator policy settings'):
            pol(definition={key: "x"}, operator=True)


@pytest.mark.parametrize(("kwargs", "text"), [
    ({"pattern": "("}, '"(" is not a valid regular expression'),
    ({"pattern": 5}, "pattern should be a string"),
    ({"priority": "1"}, 'priority should be a number, actually was "1"'),
    ({"priority": True}, "priority should be a number"),
    ({"apply_to": "queue"}, "apply-to 'queue' unrecognised"),
])
def test_invalid_fields(kwargs, text):
    with pytest.raises(PolicyError) as info:
        pol(**kwargs)
    assert text in str(info.value)


def test_defaults():
    p = make_policy("/", "p", "x", {"expires": 5}, None, None)
    assert (p.priority, p.apply_to) == (0, "all")
    assert p.to_dict() == {"vhost": "/", "name": "p", "pattern": "x", "apply-to": "all",
                           "definition": {"expires": 5}, "priority": 0}
    assert Policy.from_dict(p.to_dict()) == p


# -- matching -----------------------------------------------------------------------------------------


def test_pattern_is_a_search_anchored_only_by_the_pattern():
    assert pol(pattern="orders").matches(QUEUE, "eu.orders.new")
    assert not pol(pattern="^orders").matches(QUEUE, "eu.orders")
    assert pol(pattern="^amq\\.").matches(QUEUE, "amq.gen-123")
    assert not pol(pattern="^amq\\.$").matches(QUEUE, "amq.gen-123")
    assert pol(pattern="").matches(EXCHANGE, "anything")


@pytest.mark.parametrize(("apply_to", "queue", "classic", "quorum", "exchange"), [
    ("all", True, True, True, True),
    ("queues", True, True, True, False),
    ("classic_queues", True, True, False, False),
    ("quorum_queues", False, False, True, False),
    ("streams", False, False, False, False),
    ("exchanges", False, False, False, True),
])
def test_apply_to(apply_to, queue, classic, quorum, exchange):
    p = pol(apply_to=apply_to)
    assert p.matches(QUEUE, "q") == classic
    assert p.matches(QUEUE, "q", "classic") == classic
    assert p.matches(QUEUE, "q", "quorum") == quorum
    assert p.matches(EXCHANGE, "x") == exchange


def test_highest_priority_wins_and_ties_go_to_the_smallest_name():
    low = pol("a-low", priority=0)
    high = pol("z-high", priority=5)
    other = pol("b-other", pattern="^nope$", priority=100)
    assert select([low, high, other], QUEUE, "q") is high
    assert select([high, low], QUEUE, "q") is high
    twin_b, twin_a = pol("b", priority=5), pol("a", priority=5)
    assert select([twin_b, twin_a, low], QUEUE, "q") is twin_a
    assert select([twin_a, twin_b], QUEUE, "q") is twin_a
    assert select([pol("neg", priority=-10)], QUEUE, "q").name == "neg"
    assert select([other], QUEUE, "q") is None
    assert select([pol("f", priority=1.5), pol("i", priority=1)], QUEUE, "q").name == "f"


def test_only_one_policy_applies_no_merging():
    ttl = pol("ttl", definition={"message-ttl": 1000}, priority=1)
    length = pol("len", definition={"max-length": 5}, priority=0)
    chosen = select([ttl, length], QUEUE, "q")
    s = effective_settings({}, chosen, None)
    assert (s.message_ttl, s.max_length, s.policy) == (1000, None, "ttl")


# -- the store ------------------------------------------------------------------------------------------


def test_store_set_clear_list_match_and_round_trip():
    store = PolicyStore()
    assert store.set(pol("b", vhost="/"))
    assert store.set(pol("a", vhost="/", priority=1))
    assert not store.set(pol("a", vhost="/", priority=2))  # replaced
    assert store.set(pol("a", vhost="dev"))
    assert store.set(pol("op", vhost="/", definition={"max-length": 1}, operator=True), operator=True)
    assert [(p.vhost, p.name) for p in store.list()] == [("/", "a"), ("/", "b"), ("dev", "a")]
    assert [p.name for p in store.list("dev")] == ["a"]
    assert [p.name for p in store.list(operator=True)] == ["op"]
    assert store.get("/", "a").priority == 2
    assert store.get("/", "op") is None and store.get("/", "op", operator=True) is not None
    policy, operator_policy = store.match_queue("/", "q")
    assert (policy.name, operator_policy.name) == ("a", "op")
    assert store.match_exchange("nope", "x") == (None, None)
    assert [(op, p.name) for op, p in store] == [(False, "a"), (False, "b"), (False, "a"), (True, "op")]

    copy = PolicyStore.from_dict(store.to_dict())
    assert copy.to_dict() == store.to_dict()
    assert copy.get("/", "op", operator=True) == store.get("/", "op", operator=True)

    assert store.clear("/", "b").name == "b"
    assert store.clear("/", "b") is None
    assert store.clear("nope", "b") is None
    assert store.delete_vhost("/") == 2  # "a" and the operator policy
    assert store.vhosts() == {"dev"}
    assert store.clear("dev", "a") is not None
    assert store.vhosts() == set()


def test_from_dict_validates():
    with pytest.raises(PolicyError):
        PolicyStore.from_dict({"operator_policies": [pol(definition={"dead-letter-exchange": "x"}).to_dict()]})


# -- precedence -----------------------------------------------------------------------------------------


def test_no_policy_is_the_arguments_alone():
    args = {"x-max-length": 4, "x-overflow": "reject-publish"}
    assert effective_settings(args, None, None) == settings_from_arguments(args)


def test_precedence_examples():
    policy = pol("p", definition={"max-length": 100, "message-ttl": 60000, "overflow": "reject-publish",
                                  "dead-letter-exchange": "pol-dlx", "expires": 50000})
    operator = pol("o", definition={"max-length": 50, "message-ttl": 120000, "overflow": "drop-head"},
                   operator=True)
    s = effective_settings({"x-max-length": 20, "x-dead-letter-exchange": "arg-dlx"}, policy, operator)
    assert s.max_length == 20  # x-arg beats the policy, below the operator cap
    assert s.message_ttl == 60000  # policy (no x-arg) is smaller than the operator's
    assert s.overflow == "drop-head"  # operator beats the policy for non-numeric keys
    assert s.dead_letter_exchange == "arg-dlx"  # x-arg beats the policy
    assert s.expires == 50000  # policy only
    assert (s.policy, s.operator_policy) == ("p", "o")
    assert s.effective_policy_definition == {"max-length": 50, "message-ttl": 60000, "overflow": "drop-head",
                                             "dead-letter-exchange": "pol-dlx", "expires": 50000}

    s = effective_settings({"x-max-length": 2000, "x-overflow": "reject-publish"}, None, operator)
    assert (s.max_length, s.overflow, s.policy) == (50, "drop-head", None)  # the operator policy caps
    assert s.effective_policy_definition == operator.definition

    s = effective_settings({"x-message-ttl": 5}, policy, None)
    assert (s.message_ttl, s.max_length, s.overflow) == (5, 100, "reject-publish")


def test_merged_definition():
    assert merged_definition(None, None) == {}
    p = pol(definition={"max-length": 10, "expires": 5, "queue-leader-locator": "balanced"})
    o = pol(definition={"max-length": 3, "expires": 50, "overflow": "reject-publish"}, operator=True)
    assert merged_definition(p, o) == {"max-length": 3, "expires": 5, "queue-leader-locator": "balanced",
                                       "overflow": "reject-publish"}
    assert merged_definition(None, o) == o.definition and merged_definition(p, None) == p.definition


def test_exchange_alternate():
    ae = pol(definition={"alternate-exchange": "from-policy"}, apply_to="exchanges")
    assert exchange_alternate({}, ae) == "from-policy"
    assert exchange_alternate({"alternate-exchange": "from-arg"}, ae) == "from-arg"
    assert exchange_alternate({}, pol(definition={"max-length": 1})) is None
    assert exchange_alternate({}, None) is None


# Hypothesis: random x-arguments, policy and operator policy definitions; the precedence rules as
# properties of every resulting field.

INT_VALUES = {"message-ttl": 0, "expires": 1, "max-length": 0, "max-length-bytes": 0, "delivery-limit": 0}
STRING_VALUES = {
    "overflow": st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
    "dead-letter-exchange": st.sampled_from(["", "dlx-a", "dlx-b"]),
    "dead-letter-routing-key": st.sampled_from(["", "rk-a", "rk-b"]),
    "dead-letter-strategy": st.sampled_from(["at-most-once", "at-least-once"]),
}


def _value(key: str) -> st.SearchStrategy[Any]:
    if key in INT_VALUES:
        return st.integers(min_value=INT_VALUES[key], max_value=10**6)
    return STRING_VALUES[key]


def _definitions(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={k: _value(k) for k in keys})


QUEUE_KEYS = sorted(set(INT_VALUES) | set(STRING_VALUES))
arguments_st = _definitions(QUEUE_KEYS).map(lambda d: {"x-" + k: v for k, v in d.items()})
policy_st = st.one_of(st.none(), _definitions(QUEUE_KEYS).filter(bool).map(
    lambda d: make_policy("/", "pol", ".*", d, 0, "all")))
operator_st = st.one_of(st.none(), _definitions(sorted(OPERATOR_POLICY_KEYS)).filter(bool).map(
    lambda d: make_policy("/", "op", ".*", d, 0, "all", operator=True)))


@settings(max_examples=400, deadline=None)
@given(arguments_st, policy_st, operator_st)
def test_precedence_properties(arguments, policy, operator):
    s = effective_settings(arguments, policy, operator)
    pdef = policy.definition if policy else {}
    odef = operator.definition if operator else {}
    defaults = QueueSettings()
    for key in QUEUE_KEYS:
        value = getattr(s, POLICY_FIELDS[key])
        arg, pv, ov = arguments.get("x-" + key), pdef.get(key), odef.get(key)
        if key in NUMERIC_KEYS:
            if ov is not None:
                assert value is not None and value <= ov  # the operator policy is a ceiling
                assert value == ov or value == (arg if arg is not None else pv)
            if arg is not None:
                assert value <= arg  # never above what the client asked for
        elif ov is not None:
            assert value == ov  # the operator policy beats both
        if ov is None:
            # without an operator value: the x-argument, else the policy, else the default
            expected = arg if arg is not None else pv
            assert value == (expected if expected is not None else getattr(defaults, POLICY_FIELDS[key]))
    assert s.policy == (policy.name if policy else None)
    assert s.operator_policy == (operator.name if operator else None)
    assert s.effective_policy_definition == merged_definition(policy, operator)
    # settings a policy cannot set stay those of the arguments
    base = settings_from_arguments(arguments)
    assert (s.max_priority, s.single_active_consumer, s.consumer_timeout) == (
        base.max_priority, base.single_active_consumer, base.consumer_timeout)


@settings(max_examples=200, deadline=None)
@given(arguments_st, policy_st, st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**6))
def test_lowering_an_operator_limit_never_raises_the_result(arguments, policy, low, high):
    low, high = min(low, high), max(low, high)
    for key in ("max-length", "message-ttl", "delivery-limit", "max-length-bytes"):
        fld = POLICY_FIELDS[key]
        capped_low = effective_settings(arguments, policy, make_policy("/", "o", ".*", {key: low}, operator=True))
        capped_high = effective_settings(arguments, policy, make_policy("/", "o", ".*", {key: high}, operator=True))
        assert getattr(capped_low, fld) <= getattr(capped_high, fld)
        assert getattr(capped_low, fld) <= low


# -- RE2 patterns (issue 15, finding 6) -----------------------------------------------------------------


def test_pattern_re2_refuses_is_a_validation_error() -> None:
    with pytest.raises(PolicyError, match=r'"\^\(\?!amq\\\\\.\)" is not a valid regular expression: .*\(\?!'):
        pol(pattern="^(?!amq\\.)")


def test_stored_pattern_re2_refuses_matches_nothing_and_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    doc = pol(pattern="x").to_dict() | {"pattern": "^(?!amq\\.)"}
    with caplog.at_level("WARNING", logger="hutch.patterns"):
        stored = Policy.from_dict(doc)
    assert not stored.matches(QUEUE, "orders") and not stored.matches(QUEUE, "amq.x")
    assert "pattern of policy 'p' in vhost '/'" in caplog.text and "matches nothing" in caplog.text
    store = PolicyStore.from_dict({"policies": [doc], "operator_policies": []})
    assert store.match_queue("/", "orders") == (None, None)


def test_stored_pattern_no_engine_accepts_is_still_refused() -> None:
    with pytest.raises(PolicyError, match="is not a valid regular expression"):
        Policy.from_dict(pol(pattern="x").to_dict() | {"pattern": "("})
