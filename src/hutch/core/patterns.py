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
- A pattern is at most `MAX_PATTERN_CHARS` characters and its compiled program at most
  `MAX_PROGRAM_SIZE` RE2 instructions (issue 21: RE2's worst case is linear in program size x text, and a
  4,091-character alternation over 100 names of 254 characters stalled the loop 12.6 s). Under both caps
  one search of a 255-character name (AMQP's longest) costs at most a few milliseconds; a caller that
  matches many names (a listing, a policy applied to a vhost) slices or moves the work off the loop.
- Compiled patterns are cached (bounded), and so are the results of searches (`MATCH_CACHE_ENTRIES`
  (pattern, text) pairs node-wide): a policy re-applied to the same queue names, a permission checked on
  the same exchange, a topic permission on the same routing key cost a dict lookup after the first time.
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

MAX_PATTERN_CHARS = 1024
# RE2 instructions of one compiled program: any literal pattern of MAX_PATTERN_CHARS fits (about one per
# character, also case-insensitive); counted repetitions (`[a-z]{15}`) and `.*` chains past it are refused
MAX_PROGRAM_SIZE = 2048
# RE2's memory budget for one compiled program (its default is 8 MiB); a pattern needing more is refused
MAX_PROGRAM_BYTES = 1 << 20
# (pattern, text) -> found, over all patterns; the oldest entry goes first when full (~5 MB at most)
MATCH_CACHE_ENTRIES = 16384


class PatternError(ValueError):
    """A user-supplied pattern that is refused; the text says why, for the client. `reason` is the
    why alone (without the pattern), for callers that name the pattern themselves."""

    def __init__(self, text: str, reason: str | None = None) -> None:
        super().__init__(text)
        self.reason = reason if reason is not None else text


_found: dict[tuple[UserPattern, str], bool] = {}


class UserPattern:
    """A compiled user pattern. `search(text)` is linear in `len(text)` x `program_size`, and its
    result is cached (`MATCH_CACHE_ENTRIES`, node-wide)."""

    __slots__ = ("_regex", "pattern", "program_size")

    def __init__(self, pattern: str, regex: re2._Regexp[str] | None) -> None:
        self.pattern = pattern
        self._regex = regex
        self.program_size = regex.programsize if regex is not None else 0

    def search(self, text: str) -> bool:
        key = (self, text)
        found = _found.get(key)
        if found is None:
            found = self.search_uncached(text)
            if len(_found) >= MATCH_CACHE_ENTRIES:
                del _found[next(iter(_found))]  # the oldest: a dict keeps insertion order
            _found[key] = found
        return found

    def search_uncached(self, text: str) -> bool:
        """The search without the cache (a thread matching many names off the loop: no shared dict).
        RE2 releases the GIL while it searches."""
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
        reason = f"pattern longer than {MAX_PATTERN_CHARS} characters ({len(pattern)})"
        raise PatternError(f"invalid regular expression {_shown(pattern)}: {reason}", reason)
    try:
        regex = re2.compile(pattern, options=_options(ignore_case))
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"invalid regular expression {_shown(pattern)}: {reason}", reason) from None
    if regex.programsize > MAX_PROGRAM_SIZE:
        reason = (f"pattern too complex ({regex.programsize} RE2 instructions, at most {MAX_PROGRAM_SIZE}): "
                  "use a shorter pattern")
        raise PatternError(f"invalid regular expression {_shown(pattern)}: {reason}", reason)
    return UserPattern(pattern, regex)


def _shown(pattern: str) -> str:
    return repr(pattern) if len(pattern) <= 80 else repr(pattern[:80]) + "..."


class _MatchesNothing(UserPattern):
    """A stored pattern RE2 refused: it matches no name (access denied, policy not applied)."""

    __slots__ = ()

    def search(self, text: str) -> bool:
        return False

    def search_uncached(self, text: str) -> bool:
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
