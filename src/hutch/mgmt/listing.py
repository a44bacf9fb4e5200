"""Sorting, filtering, pagination and column selection of API replies (RabbitMQ's query parameters).

Owns: `list_reply` and `one_reply`, which turn the plain JSON-able objects the service layer returns
into what a list or object endpoint answers, given the request's query parameters. Pure.

Rules (RabbitMQ's `rabbit_mgmt_util`):
- Lists are sorted by `vhost` then `name` (missing fields sort as 0, before everything).
  `sort=FIELD` (dotted for nested fields, e.g. `message_stats.publish`) becomes the primary key;
  `sort_reverse=true` reverses the result. Values compare in Erlang term order: numbers, then
  atoms (true/false/null), then objects, then lists, then strings.
- Pagination is on when `page` is given: `page_size` defaults to 100 and is at most 500. The
  reply is then an object (`items`, `item_count`, `filtered_count`, `total_count`, `page`,
  `page_size`, `page_count`). `name` filters items by a case-insensitive substring of their
  `name`, or by a case-insensitive regular expression with `use_regex=true`; as in RabbitMQ the
  filter applies only to paginated requests. The expression is compiled with RE2
  (hutch.core.patterns): matching is linear in the name, and a pattern RE2 refuses (or longer than its
  caps) is a 400. When matching every name would cost more than `INLINE_MATCH_BUDGET` (characters of the
  names x the pattern's RE2 program size, about 20 ms at RE2's worst), the listing raises `NamesToMatch`
  instead: the HTTP layer matches the names off the event loop (RE2 releases the GIL) and calls the
  handler again with a `MatchedQuery` that carries the answer (issue 21: 100 names of 254 characters and a
  4,091-character alternation stalled the loop 12.6 s).
- `columns=a,b.c` keeps only those fields (dotted paths select nested fields) of each item, or
  of the object an object endpoint returns.
- Long lists (queues, exchanges) go through `paged_reply`: when a page is asked for and the sort keys
  are among a few cheap fields, items are sorted and filtered on those fields and only the page is
  formatted in full, as RabbitMQ formats only the page's items. The reply is the same as
  `list_reply`'s on the full items. `paged_reply_of` is the same for objects the management agent
  holds (queues): their cheap fields are sorted and filtered, and only the page is fetched in full.
- Invalid parameters are 400s with RabbitMQ's error names and texts.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from hutch.core.patterns import PatternError, UserPattern, compile_pattern

from .errors import ApiError

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
DEFAULT_SORT = ("vhost", "name")

# characters of names x RE2 program size matched on the loop; RE2's worst case is ~8 ns a unit (20 ms)
INLINE_MATCH_BUDGET = 2_500_000

Query = Mapping[str, str]
T = TypeVar("T")


class NamesToMatch(Exception):
    """Matching `pattern` against `names` is too much work for the event loop: match them elsewhere and
    call the handler again with a `MatchedQuery`."""

    def __init__(self, pattern: UserPattern, names: list[str]) -> None:
        super().__init__(f"{len(names)} names to match")
        self.pattern = pattern
        self.names = names


class MatchedQuery(dict[str, str]):
    """A request's query whose regex `name` filter was already matched (off the loop) against `checked`
    names: `found` are those it matches. A name not checked (created since) is matched on the loop."""

    def __init__(self, query: Query, checked: frozenset[str], found: frozenset[str]) -> None:
        super().__init__(query)
        self.checked = checked
        self.found = found


def list_reply(items: Sequence[dict[str, Any]], query: Query,
               default_sort: Sequence[str] = DEFAULT_SORT) -> Any:
    """Sort, filter, paginate and select columns of a list endpoint's items."""
    pagination = _pagination(query)
    ordered = sort_items(items, default_sort, query.get("sort") or None, query.get("sort_reverse") == "true")
    columns = _columns(query)
    if pagination is None:
        return [select_columns(item, columns) for item in ordered]
    page, page_size, name, use_regex = pagination
    filtered = _filter_by_name(ordered, name, use_regex, query)
    offset = _offset(page, page_size, len(filtered))
    selected = filtered[offset:offset + page_size]
    return _page(selected, len(filtered), len(items), page, page_size, columns)


def _offset(page: int, page_size: int, filtered: int) -> int:
    """Where the page starts; a page past the end (other than the first) is RabbitMQ's 400."""
    offset = (page - 1) * page_size
    if page > 1 and offset >= filtered:
        raise ApiError(400, "page_out_of_range",
                       f"Page out of range, page: {page} page size: {page_size}, len: {filtered}")
    return offset


def _page(selected: list[dict[str, Any]], filtered: int, total: int, page: int, page_size: int,
          columns: list[list[str]] | None) -> dict[str, Any]:
    """A paginated reply (RabbitMQ's field names)."""
    return {
        "filtered_count": filtered,
        "item_count": len(selected),
        "items": [select_columns(item, columns) for item in selected],
        "page": page,
        "page_count": (filtered + page_size - 1) // page_size,
        "page_size": page_size,
        "total_count": total,
    }


def paged_reply(objects: Sequence[T], query: Query, light: Callable[[T], dict[str, Any]],
                full: Callable[[T], dict[str, Any]], default_sort: Sequence[str] = DEFAULT_SORT) -> Any:
    """`list_reply` of `[full(o) for o in objects]`, formatting only the page's objects when it can:
    with pagination on and every sort key a top-level field of `light(o)` (cheap fields: name, vhost,
    counts). Otherwise every object is formatted."""
    pagination = _pagination(query)
    sort = query.get("sort") or None
    if pagination is None or not objects:
        return list_reply([full(o) for o in objects], query, default_sort)
    keys = list(default_sort) if sort is None else [sort, *default_sort]
    page, page_size, name, use_regex = pagination
    reverse = query.get("sort_reverse") == "true"
    if set(keys) <= _NAME_KEYS:  # the default order: strings read straight off the objects, no dicts
        names = [k for k in dict.fromkeys(keys)]
        chosen: list[Any] = sorted(objects, key=lambda o: [getattr(o, k) for k in names])
        if reverse:
            chosen.reverse()
        if name:
            keep = _name_matcher(name, use_regex, query, [o.name for o in chosen])
            chosen = [o for o in chosen if keep(o.name)]
    else:
        sample = light(objects[0])
        if any(key not in sample for key in keys):
            return list_reply([full(o) for o in objects], query, default_sort)
        lights = [light(o) for o in objects]
        for i, item in enumerate(lights):
            item[_INDEX] = i
        ordered = sort_items(lights, default_sort, sort, reverse)
        chosen = [objects[item[_INDEX]] for item in _filter_by_name(ordered, name, use_regex, query)]
    filtered = chosen
    offset = _offset(page, page_size, len(filtered))
    columns = _columns(query)
    selected = [full(o) for o in filtered[offset:offset + page_size]]
    return _page(selected, len(filtered), len(objects), page, page_size, columns)


async def paged_reply_of(lights: list[dict[str, Any]], query: Query,
                         fetch: Callable[[list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]],
                         default_sort: Sequence[str] = DEFAULT_SORT) -> Any:
    """`paged_reply` for objects the management agent summarised: `lights` are their cheap fields (as
    `light` gives them), `fetch(some)` their full objects, in the same order. Only the page is fetched
    when a page is asked for and every sort key is among the cheap fields; the reply is `list_reply`'s on
    the full objects."""
    pagination = _pagination(query)
    sort = query.get("sort") or None
    keys = list(default_sort) if sort is None else [sort, *default_sort]
    if pagination is None or not lights or any(key not in lights[0] for key in keys):
        return list_reply(await fetch(lights), query, default_sort)
    page, page_size, name, use_regex = pagination
    ordered = sort_items(lights, default_sort, sort, query.get("sort_reverse") == "true")
    filtered = _filter_by_name(ordered, name, use_regex, query)
    offset = _offset(page, page_size, len(filtered))
    columns = _columns(query)
    selected = await fetch(filtered[offset:offset + page_size])
    return _page(selected, len(filtered), len(lights), page, page_size, columns)


_INDEX = "\x00index"  # the position of a light item's object (not a JSON field name anyone sends)
_NAME_KEYS = {"vhost", "name"}  # attributes of queues and exchanges, always strings


def one_reply(obj: Any, query: Query) -> Any:
    """An object endpoint's reply: only `columns` applies."""
    return select_columns(obj, _columns(query))


# -- sorting ----------------------------------------------------------------------------------------


def sort_items(items: Sequence[dict[str, Any]], default_sort: Sequence[str], sort: str | None,
               reverse: bool) -> list[dict[str, Any]]:
    keys = list(default_sort) if sort is None else [sort] + [k for k in default_sort if k != sort]
    paths = [key.split(".") for key in keys]
    if all(len(path) == 1 for path in paths):  # top-level fields: no path walking (the common case)
        names = [path[0] for path in paths]
        if all(type(item.get(n)) is str for item in items[:1] for n in names) and \
                all(type(item.get(n)) is str for item in items for n in names):
            ordered = sorted(items, key=lambda item: [item[n] for n in names])  # strings: plain order
        else:
            ordered = sorted(items, key=lambda item: [_term_order(item.get(n, 0)) for n in names])
    else:
        ordered = sorted(items, key=lambda item: [_term_order(_dotted(item, path)) for path in paths])
    if reverse:
        ordered.reverse()
    return ordered


def _dotted(item: Any, path: list[str]) -> Any:
    value = item
    for part in path:
        if not isinstance(value, dict):
            return 0
        value = value.get(part, 0)
    return value


def _term_order(value: Any) -> tuple[int, Any]:
    """A sort key that orders mixed values the way Erlang orders terms."""
    if type(value) is str:
        return (4, value)
    if value is None or isinstance(value, bool):
        return (1, str(value))
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, dict):
        return (2, sorted((str(k), repr(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (3, [repr(v) for v in value])
    return (4, str(value))


# -- pagination -------------------------------------------------------------------------------------


def _int_param(query: Query, key: str) -> int | None:
    text = query.get(key)
    if text is None:
        return None
    if not re.fullmatch(r"[+-]?\d+", text.strip()):
        raise ApiError(400, "bad_request", "Pagination parameters are invalid")
    return int(text)


def _pagination(query: Query) -> tuple[int, int, str | None, bool] | None:
    page = _int_param(query, "page")
    page_size = _int_param(query, "page_size")
    if page is None:
        return None
    size = DEFAULT_PAGE_SIZE if page_size is None else page_size
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        raise ApiError(400, "invalid_pagination_parameters",
                       f"Invalid pagination parameters: page number {page}, page size "
                       f"{'undefined' if page_size is None else page_size}")
    name = query.get("name") or None
    return page, size, name, query.get("use_regex") == "true"


def name_pattern(name: str) -> UserPattern:
    """The compiled `name` filter of `use_regex=true` (case-insensitive, RE2), or a 400."""
    try:
        return compile_pattern(name, ignore_case=True)  # RE2: linear in the name, never a stall
    except PatternError as exc:
        raise ApiError(400, "bad_request", str(exc)) from None


def _name_matcher(name: str, use_regex: bool, query: Query, names: list[Any]) -> Callable[[Any], bool]:
    """RabbitMQ's name filter: a case-insensitive substring, or regular expression with use_regex.
    Raises `NamesToMatch` when matching the regex against `names` is too much for the loop."""
    if use_regex:
        pattern = name_pattern(name)
        if isinstance(query, MatchedQuery):
            checked, found = query.checked, query.found
            return lambda value: isinstance(value, str) and (
                value in found if value in checked else pattern.search_uncached(value))
        texts = [n for n in names if isinstance(n, str)]
        if sum(map(len, texts)) * pattern.program_size > INLINE_MATCH_BUDGET:
            raise NamesToMatch(pattern, texts)
        return lambda value: isinstance(value, str) and pattern.search_uncached(value)
    needle = name.lower()
    return lambda value: isinstance(value, str) and needle in value.lower()


def _filter_by_name(items: list[dict[str, Any]], name: str | None, use_regex: bool,
                    query: Query) -> list[dict[str, Any]]:
    if not name:
        return items
    keep = _name_matcher(name, use_regex, query, [i.get("name") for i in items])
    return [i for i in items if keep(i.get("name"))]


# -- columns ----------------------------------------------------------------------------------------


def _columns(query: Query) -> list[list[str]] | None:
    text = query.get("columns")
    if text is None:
        return None
    return [[part for part in column.split(".") if part] for column in text.split(",") if column.strip()]


def select_columns(obj: Any, columns: list[list[str]] | None) -> Any:
    """Keep the fields named by `columns` (each a dotted path split in parts); None keeps all."""
    if columns is None:
        return obj
    if isinstance(obj, list):
        return [select_columns(item, columns) for item in obj]
    if not isinstance(obj, dict):
        return obj
    out: dict[str, Any] = {}
    for key, value in obj.items():
        wanted = [col for col in columns if col and col[0] == key]
        if not wanted:
            continue
        if any(len(col) == 1 for col in wanted):
            out[key] = value
        else:
            out[key] = select_columns(value, [col[1:] for col in wanted])
    return out


__all__ = ["DEFAULT_PAGE_SIZE", "INLINE_MATCH_BUDGET", "MAX_PAGE_SIZE", "MatchedQuery", "NamesToMatch",
           "list_reply", "name_pattern", "one_reply", "paged_reply", "paged_reply_of", "select_columns",
           "sort_items"]
