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
"""

from __future__ import annotations

from functools import lru_cache

import re2

MAX_PATTERN_CHARS = 4096
# RE2's memory budget for one compiled program (its default is 8 MiB); a pattern needing more is refused
MAX_PROGRAM_BYTES = 1 << 20


class PatternError(ValueError):
    """A user-supplied pattern that is refused; the text says why, for the client."""


class UserPattern:
    """A compiled user pattern. `search(text)` is linear in `len(text)`."""

    __slots__ = ("_regex", "pattern")

    def __init__(self, pattern: str, regex: re2._Regexp) -> None:
        self.pattern = pattern
        self._regex = regex

    def search(self, text: str) -> bool:
        return self._regex.search(text) is not None

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
        raise PatternError(f"invalid regular expression {pattern!r}: {reason}") from None
    return UserPattern(pattern, regex)


def check_pattern(pattern: str) -> None:
    """Validate only (raises `PatternError`)."""
    compile_pattern(pattern)


def search(pattern: str, text: str) -> bool:
    """`compile_pattern(pattern).search(text)`; raises `PatternError` for a refused pattern."""
    return compile_pattern(pattern).search(text)
