"""The stream protocol's metadata placement (runtime/stream_session/metadata.py's `placement`), pure: a
stream's leader and replicas as broker references, this node reference 0, the workers of a node one
node, a node that is not a member referring to every member by its listener."""

from __future__ import annotations

from hutch.runtime.stream_session.metadata import NO_BROKER, placement
from hutch.streamproto.codes import Code

A, B, C = ("127.0.0.1", 5552), ("10.0.0.2", 5552), ("10.0.0.3", 5552)


def brokers() -> dict[tuple[str, int], int]:
    return {A: 0}


def test_a_stream_of_this_node_only_is_led_here_without_replicas() -> None:
    assert placement("s", None, brokers()) == ("s", Code.OK, 0, [])


def test_a_member_names_the_writer_and_the_other_members_once() -> None:
    known = brokers()
    entry = placement("s", ("n1", "n2", [("n2", B), ("n1", A), ("n3", C)]), known)
    assert entry == ("s", Code.OK, 1, [0, 2]) and known == {A: 0, B: 1, C: 2}


def test_the_workers_of_this_node_are_this_node_once() -> None:
    members = ("n#w1", "n#w0", [("n#w0", A), ("n#w1", A), ("n#w2", A)])
    assert placement("s", members, brokers()) == ("s", Code.OK, 0, [])


def test_a_node_that_is_not_a_member_refers_to_the_members_listeners() -> None:
    known = brokers()
    assert placement("s", ("n3", "n1", [("n1", B), ("n2", C)]), known) == ("s", Code.OK, 1, [2])
    assert known == {A: 0, B: 1, C: 2}  # (this node stays reference 0, named by no stream)


def test_no_writer_or_an_unknown_writer_listener_is_not_available() -> None:
    assert placement("s", ("n1", None, [("n1", A), ("n2", B)]), brokers()) == ("s", Code.STREAM_NOT_AVAILABLE,
                                                                               NO_BROKER, [])
    assert placement("s", ("n1", "n2", [("n2", None), ("n1", A)]), brokers())[1] == Code.STREAM_NOT_AVAILABLE
