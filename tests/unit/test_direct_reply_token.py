"""Direct Reply-To tokens name their requester's node (core/direct_reply.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hutch.core.direct_reply import new_token, token_node


@given(st.text(min_size=1, max_size=80))
def test_a_token_names_its_node(node: str) -> None:
    token = new_token(node)
    assert token_node(token) == node
    assert new_token(node) != token


def test_a_token_that_names_no_node() -> None:
    for token in ("", "abc", "abc.", "abc.!!!", "abc.//8", "x." + "A" * 2000):
        assert token_node(token) is None
