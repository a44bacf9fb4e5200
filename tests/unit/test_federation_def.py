"""Federation's pure rules (core/federation.py): upstream and upstream-set parameters, which upstreams a
policy names, and the x-received-from header (max-hops, loop detection)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hutch.core import federation as fed


def test_upstream_defaults_and_keys() -> None:
    u = fed.parse_upstream("up", {"uri": "amqp://h"})
    assert (u.max_hops, u.prefetch_count, u.reconnect_delay_s, u.ack_mode, u.exchange, u.queue) == \
        (1, 1000, 5.0, "on-confirm", None, None)
    u = fed.parse_upstream("up", {"uri": ["amqp://a", "amqp://b"], "exchange": "x", "max-hops": 3, "expires": 60000,
                                  "message-ttl": 10, "prefetch-count": 5, "ack-mode": "on-publish"})
    assert u.uris == ("amqp://a", "amqp://b") and u.max_hops == 3 and u.expires_ms == 60000 and u.prefetch_count == 5


def test_upstream_errors() -> None:
    with pytest.raises(fed.FederationDefError) as info:
        fed.parse_upstream("up", {"max-hops": 0, "ack-mode": "x", "bogus": 1, "exchange": 3})
    problems = info.value.problems
    assert 'Key "uri" not found in up' in problems and 'Unrecognised terms ["bogus"] in up' in problems
    assert "max-hops should be a number greater than or equal to 1, actually was 0" in problems
    assert "exchange should be binary, actually was 3" in problems
    with pytest.raises(fed.FederationDefError):
        fed.parse_upstream("up", {"uri": "http://x"})
    with pytest.raises(fed.FederationDefError):
        fed.parse_upstream_set("s", [{"name": "x"}])
    assert fed.parse_upstream_set("s", [{"upstream": "a"}, {"upstream": "b"}]) == ["a", "b"]


def test_which_upstreams_a_policy_names() -> None:
    ups = {n: fed.parse_upstream(n, {"uri": "amqp://h"}) for n in ("a", "b", "c")}
    names = lambda d, sets=None: [u.name for u in fed.upstreams_for(d, ups, sets or {})]  # noqa: E731
    assert names({"federation-upstream": "b"}) == ["b"]
    assert names({"federation-upstream": "zz"}) == []
    assert names({"federation-upstream-set": "all"}) == ["a", "b", "c"]
    assert names({"federation-upstream-set": "s"}, {"s": ["c", "zz", "a"]}) == ["c", "a"]
    assert names({"max-length": 1}) == []


def test_stamp_prepends_and_hides_the_password() -> None:
    first = fed.stamp(None, "amqp://u:secret@h/v", "x", False, "site-a")
    second = fed.stamp(first, "amqp://h2", "x", True, "site-b")
    assert [e["cluster-name"] for e in second[fed.RECEIVED_FROM]] == ["site-b", "site-a"]
    assert "secret" not in str(second)


hops = st.lists(st.sampled_from(["site-a", "site-b", "site-c"]), max_size=5)


@given(hops, st.integers(min_value=1, max_value=6), st.sampled_from(["site-a", "site-b", "site-z"]))
def test_may_forward_is_max_hops_and_no_loop(path: list[str], max_hops: int, local: str) -> None:
    headers: dict[str, object] | None = None
    for cluster in reversed(path):
        headers = fed.stamp(headers, "amqp://h", "x", False, cluster)
    assert fed.may_forward(headers, local, max_hops) == (len(path) < max_hops and local not in path)
