"""The one import point of the hot path: the compiled `_cframes` when it was built, else the pure
reference in `frames`.

Owns: the choice, made once at import, and the sentence that says which path runs (`describe()`,
logged once when the server starts). `HUTCH_PURE=1` forces the pure path (the tests run both). The
two paths have the same interface and give the same output for the same input
(tests/codec/test_speedups.py).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

from . import frames as _pure

__all__ = ["COMPILED", "FrameReader", "append_delivery", "describe", "parse_ack", "parse_content_header",
           "parse_publish", "stream_plain_run"]


def _select() -> tuple[ModuleType, str]:
    """The module to use and, when it is the pure one, why."""
    if os.environ.get("HUTCH_PURE", "") not in ("", "0"):
        return _pure, "HUTCH_PURE is set"
    try:
        from hutch.amqp import _cframes
    except ImportError as exc:
        return _pure, f"compiled part not built: {exc}"
    missing = missing_names(_cframes)
    if missing:  # built from an older _cframes.pyx: using it would fail on the first publish
        return _pure, f"compiled part out of date (no {', '.join(missing)}; rebuild it: pip install -e .)"
    return _cframes, ""


def missing_names(module: ModuleType) -> list[str]:
    """What the interface needs that `module` lacks (a compiled part built from an older source)."""
    missing = [name for name in ("FrameReader", "parse_publish", "parse_content_header", "parse_ack",
                                 "append_delivery", "stream_plain_run") if not hasattr(module, name)]
    reader = getattr(module, "FrameReader", None)
    missing += [f"FrameReader.{name}" for name in ("feed", "frames", "take_content", "take_publishes",
                                                         "cut_unfinished_publish")
                if reader is not None and not hasattr(reader, name)]
    return missing


_impl, _REASON = _select()
COMPILED = _impl is not _pure

if TYPE_CHECKING:  # the type checker sees the reference's signatures; the compiled ones are the same
    from .frames import (
        FrameReader,
        append_delivery,
        parse_ack,
        parse_content_header,
        parse_publish,
        stream_plain_run,
    )
else:
    FrameReader = _impl.FrameReader
    parse_publish = _impl.parse_publish
    parse_content_header = _impl.parse_content_header
    parse_ack = _impl.parse_ack
    append_delivery = _impl.append_delivery
    stream_plain_run = _impl.stream_plain_run


def describe() -> str:
    """Which hot path runs, in one sentence for the start log."""
    return "compiled hot path: on" if COMPILED else f"pure-Python hot path ({_REASON})"
