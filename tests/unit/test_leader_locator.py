"""The leader locator of new quorum queues: which setting wins, and the config key (issue 7)."""

from __future__ import annotations

import pytest

from hutch.config import ConfigError, load_config, parse_config_text
from hutch.runtime.queue_types.quorum.queue import leader_locator


@pytest.mark.parametrize(("policy", "arguments", "default", "expected"), [
    ({}, {}, "client-local", "client-local"),
    ({}, {}, "balanced", "balanced"),
    ({}, {"x-queue-leader-locator": "balanced"}, "client-local", "balanced"),
    ({}, {"x-queue-master-locator": "min-masters"}, "client-local", "balanced"),  # 3.x name, 4.x alias
    ({}, {"x-queue-leader-locator": "client-local"}, "balanced", "client-local"),
    ({"queue-leader-locator": "balanced"}, {"x-queue-leader-locator": "client-local"}, "client-local",
     "balanced"),  # a policy wins over the argument, as in rabbit_queue_location
    ({"queue-leader-locator": "client-local"}, {"x-queue-leader-locator": "balanced"}, "balanced",
     "client-local"),
    ({}, {"x-queue-leader-locator": "random"}, "client-local", "balanced"),
    ({}, {"x-queue-leader-locator": "least-leaders"}, "client-local", "balanced"),
])
def test_precedence(policy: dict, arguments: dict, default: str, expected: str) -> None:
    assert leader_locator(policy, arguments, default) == expected


def test_config_key() -> None:
    assert parse_config_text("queue_leader_locator = balanced")[0] == {"queue_leader_locator": "balanced"}
    assert load_config({}, {}, hostname="h").queue_leader_locator == "client-local"
    with pytest.raises(ConfigError, match="queue_leader_locator"):
        parse_config_text("queue_leader_locator = nearest")
