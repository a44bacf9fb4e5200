"""Regular expressions that users supply, matched in linear time.

This module owns every pattern a client or operator hands to hutch: listing filters
(`?use_regex=true&name=...`), policy and operator-policy patterns, permission regexes
(configure/write/read) and topic-permission regexes, `hutch-queues` filters. Python's `re`
backtracks: `(.*.*)*(.*.*)*#` against a 30-character name runs for seconds on the event loop.
These patterns are compiled with RE2 (`google-re2`), whose matching time is linear in the input
and whose compile step is bounded in memory, so no pattern can stall the node.

Rules:
- Matching is `search` (unanchored), as Erlang's `re:run` in RabbitMQ: anchor with `^`/`$`.
- A pattern RE2 cannot compile (backreferences, lookaround, too big) is refused up front with
  `PatternError`, whose text says why; callers answer it as a 400 / 406 / validation error.
- Patterns are at most `MAX_PATTERN_CHARS` characters; compiled patterns are cached (bounded).
- A pattern that was stored before it could be checked (the definitions log of a node that ran
  Python's `re`, a cluster's replicated metadata, a RabbitMQ export loaded at boot) is compiled
  with `compile_stored`: one RE2 refuses but Python's `re` (hutch's engine before RE2, close to
  PCRE) accepts is logged as a warning and matches nothing, so a node never fails to start over it
  (PCRE's lookahead `^(?!amq)` is the usual case). One neither engine accepts is corrupt data:
  `PatternError`, as before.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache

import re2

log = logging.getLogger("hutch.patterns")

MAX_PATTERN_CHARS = 4096
# RE2's memory budget for one compiled program (its default is 8 MiB); a pattern needing more is refused
MAX_PROGRAM_BYTES = 1 << 20


class PatternError(ValueError):
    """A user-supplied pattern that is refused; the text says why, for the client. `reason` is the
    why alone (without the pattern), for callers that name the pattern themselves."""

    def __init__(self, text: str, reason: str | None = None) -> None:
        super().__init__(text)
        self.reason = reason if reason is not None else text


class UserPattern:
    """A compiled user pattern. `search(text)` is linear in `len(text)`."""

    __slots__ = ("_regex", "pattern")

    def __init__(self, pattern: str, regex: re2._Regexp[str] | None) -> None:
        self.pattern = pattern
        self._regex = regex

    def search(self, text: str) -> bool:
        regex = self._regex
        assert regex is not None  # Invariant: only _MatchesNothing has none, and it overrides search
        return regex.search(text) is not None

    def __repr__(self) -> str:
        return f"UserPattern({self.pattern!r})"


def _options(ignore_case: bool) -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_PROGRAM_BYTES
    options.case_sensitive = not ignore_case
    options.log_errors = False
    return options


@lru_cache(maxsize=1024)
def compile_pattern(pattern: str, ignore_case: bool = False) -> UserPattern:
    """Compile `pattern` or raise `PatternError` with a one-line reason."""
    if not isinstance(pattern, str):
        raise PatternError("pattern must be a string")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise PatternError(f"pattern longer than {MAX_PATTERN_CHARS} characters")
    try:
        regex = re2.compile(pattern, options=_options(ignore_case))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"invalid regular expression {pattern!r}: {reason}", reason) from None
    return UserPattern(pattern, regex)


class _MatchesNothing(UserPattern):
    """A stored pattern RE2 refused: it matches no name (access denied, policy not applied)."""

    __slots__ = ()

    def search(self, text: str) -> bool:
        return False


def accepted_before(pattern: str) -> bool:
    """Could hutch have stored `pattern` before it used RE2 (does Python's `re` compile it)? Only
    compiles, never matches, so it cannot stall on a hostile pattern's input."""
    if not isinstance(pattern, str):
        return False
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def compile_stored(pattern: str, what: str) -> UserPattern:
    """Compile a pattern that is already stored. One RE2 refuses but `accepted_before` is logged
    (naming `what`, e.g. "pattern of policy 'p' in vhost '/'") and matches nothing; one neither
    engine accepts raises `PatternError` (corrupt data)."""
    try:
        return compile_pattern(pattern)
    except PatternError as exc:
        if not accepted_before(pattern):
            raise
        log.warning("%s: %s; it matches nothing until it is set again", what, exc)
        return _MatchesNothing(pattern, None)


def check_pattern(pattern: str) -> None:
    """Validate only (raises `PatternError`)."""
    compile_pattern(pattern)


def search(pattern: str, text: str) -> bool:
    """`compile_pattern(pattern).search(text)`; raises `PatternError` for a refused pattern."""
    return compile_pattern(pattern).search(text)
