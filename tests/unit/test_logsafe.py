"""hutch.core.logsafe: user strings escaped and capped for one log line (issue 15, finding 11)."""

from __future__ import annotations

import logging
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from hutch.core.logsafe import (
    MAX_LOGGED_ARG_CHARS,
    MAX_LOGGED_CHARS,
    LogThrottle,
    SafeArgsFilter,
    safe,
    suppressed_note,
)


def test_plain_names_are_unchanged():
    assert safe("orders.eu-1") == "orders.eu-1"
    assert safe("événement") == "événement"


def test_controls_and_line_separators_are_escaped():
    assert safe("a\nb\r\tc\x00d\x7fe\u2028f\\") == "a\\nb\\r\\tc\\x00d\\x7fe\\u2028f\\\\"


def test_long_strings_are_truncated_with_a_marker():
    text = safe("x" * 100_000)
    assert text == "x" * MAX_LOGGED_CHARS + "...[truncated, 100000 chars]"


@given(st.text(max_size=600))
def test_never_a_line_break_and_bounded(text):
    out = safe(text)
    assert len(out.splitlines()) <= 1
    assert len(out) <= 10 * MAX_LOGGED_CHARS + 40


def _record(msg, *args):
    return logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, None)


def test_filter_escapes_every_argument_and_leaves_safe_output_alone():
    record = _record("user '%s' %s %d", "a\nb", ValueError("x\ny"), 5)
    assert SafeArgsFilter().filter(record)
    assert record.getMessage() == "user 'a\\nb' x\\ny 5"
    already = safe("back\\slash\n")
    record = _record("%s", already)
    SafeArgsFilter().filter(record)
    assert record.getMessage() == already


def test_filter_caps_arguments_and_escapes_fstring_messages():
    record = _record("%s", "y" * (MAX_LOGGED_ARG_CHARS + 10))
    SafeArgsFilter().filter(record)
    assert record.getMessage().endswith(f"...[truncated, {MAX_LOGGED_ARG_CHARS + 10} chars]")
    record = _record("built\nwith an f-string")
    SafeArgsFilter().filter(record)
    assert record.getMessage() == "built\\nwith an f-string"


def test_log_throttle_writes_n_lines_per_window_and_counts_the_rest() -> None:
    throttle = LogThrottle(max_lines=3, interval_s=10.0)
    assert [throttle.admit(t) for t in (0.0, 1.0, 2.0, 3.0, 4.0)] == [0, 0, 0, None, None]
    assert throttle.admit(10.5) == 2  # a new window: the first line says two were left out
    assert throttle.admit(11.0) == 0
    assert suppressed_note(2) == " (2 similar lines suppressed before this one)" and suppressed_note(0) == ""


@given(st.lists(st.floats(min_value=0, max_value=100, allow_nan=False), max_size=200))
def test_log_throttle_never_loses_count_and_never_exceeds_the_bound(gaps: list[float]) -> None:
    throttle = LogThrottle(max_lines=5, interval_s=10.0)
    now, written, reported, per_window = 0.0, 0, 0, Counter()
    for gap in gaps:
        now += gap
        answer = throttle.admit(now)
        if answer is not None:
            written += 1
            reported += answer
            per_window[throttle.window_start] += 1
    assert written + reported + throttle.suppressed == len(gaps)  # every line written, reported or pending
    assert all(n <= 5 for n in per_window.values())


def test_a_throttle_without_an_interval_follows_the_process_setting() -> None:
    """`log.throttle_interval` (hutch-server sets it at start-up); an explicit interval stays its own."""
    follows, own = LogThrottle(max_lines=1), LogThrottle(max_lines=1, interval_s=10.0)
    before = LogThrottle.default_interval_s
    try:
        LogThrottle.set_default_interval(0.5)
        assert [follows.admit(t) for t in (0.0, 0.2, 0.6)] == [0, None, 1]
        assert [own.admit(t) for t in (0.0, 0.2, 0.6)] == [0, None, None]
    finally:
        LogThrottle.set_default_interval(before)
    assert follows.interval_s == 10.0
