"""Pure tests of the management API's list handling (sort, filter, paginate, columns) and tag parsing."""

from __future__ import annotations

import pytest

from hutch.mgmt.access import Principal, parse_tags
from hutch.mgmt.errors import ApiError, from_amqp
from hutch.mgmt.listing import list_reply, one_reply

ITEMS = [
    {"name": "b", "vhost": "/", "messages": 3, "stats": {"n": 2}},
    {"name": "a", "vhost": "/", "messages": 10, "stats": {"n": 1}},
    {"name": "c", "vhost": "/x", "messages": 1},
    {"name": "A2", "vhost": "/", "messages": 5, "stats": {"n": 3}},
]


def names(items):
    return [i["name"] for i in items]


def test_default_sort_is_vhost_then_name():
    assert names(list_reply(ITEMS, {})) == ["A2", "a", "b", "c"]


def test_sort_field_and_reverse_and_dotted_missing_first():
    assert names(list_reply(ITEMS, {"sort": "messages"})) == ["c", "b", "A2", "a"]
    assert names(list_reply(ITEMS, {"sort": "messages", "sort_reverse": "true"})) == ["a", "A2", "b", "c"]
    # a missing nested field sorts as 0, before every number
    assert names(list_reply(ITEMS, {"sort": "stats.n"})) == ["c", "a", "b", "A2"]


def test_mixed_types_sort_in_erlang_term_order():
    items = [{"name": "s", "v": "x"}, {"name": "n", "v": 2}, {"name": "b", "v": True}, {"name": "l", "v": [1]}]
    assert names(list_reply(items, {"sort": "v"})) == ["n", "b", "l", "s"]


def test_pagination_shape_and_name_filter():
    page = list_reply(ITEMS, {"page": "1", "page_size": "2"})
    assert page == {"filtered_count": 4, "item_count": 2, "items": page["items"], "page": 1, "page_count": 2,
                    "page_size": 2, "total_count": 4}
    assert names(page["items"]) == ["A2", "a"]
    assert names(list_reply(ITEMS, {"page": "2", "page_size": "2"})["items"]) == ["b", "c"]
    filtered = list_reply(ITEMS, {"page": "1", "name": "a"})
    assert (filtered["filtered_count"], filtered["total_count"], filtered["page_size"]) == (2, 4, 100)
    regex = list_reply(ITEMS, {"page": "1", "name": "^[ab]$", "use_regex": "true"})
    assert names(regex["items"]) == ["a", "b"]
    # as in RabbitMQ, `name` filters only paginated requests
    assert len(list_reply(ITEMS, {"name": "a"})) == 4


@pytest.mark.parametrize("query, error", [
    ({"page": "0"}, "invalid_pagination_parameters"),
    ({"page": "1", "page_size": "501"}, "invalid_pagination_parameters"),
    ({"page": "x"}, "bad_request"),
    ({"page": "3", "page_size": "2"}, "page_out_of_range"),
    ({"page": "1", "name": "(", "use_regex": "true"}, "bad_request"),
])
def test_bad_pagination_is_400(query, error):
    with pytest.raises(ApiError) as info:
        list_reply(ITEMS, query)
    assert (info.value.status, info.value.error) == (400, error)


def test_columns_select_fields_and_nested_fields():
    assert list_reply(ITEMS, {"columns": "name,stats.n", "sort": "name"})[0] == {"name": "A2", "stats": {"n": 3}}
    paged = list_reply(ITEMS, {"columns": "name", "page": "1", "page_size": "1"})
    assert paged["items"] == [{"name": "A2"}]
    assert one_reply({"a": 1, "b": {"c": 2, "d": 3}}, {"columns": "b.d"}) == {"b": {"d": 3}}


def test_parse_tags_accepts_string_and_list():
    assert parse_tags("administrator, monitoring,,") == ["administrator", "monitoring"]
    assert parse_tags(["management", "management"]) == ["management"]
    assert parse_tags(None) == []
    with pytest.raises(ValueError):
        parse_tags(3)


def test_principal_tags():
    assert Principal("a", ("administrator",)).is_monitor
    assert Principal("m", ("monitoring",)).is_monitor and not Principal("m", ("monitoring",)).is_admin
    assert Principal("p", ("policymaker",)).is_management
    assert not Principal("n", ("impersonator",)).is_management


def test_amqp_errors_map_to_rabbitmq_http_replies():
    from hutch.amqp.errors import ChannelError

    assert from_amqp(ChannelError(403, "nope")).body() == {"error": "not_authorised", "reason": "Access refused."}
    assert from_amqp(ChannelError(404, "no queue 'q'")).status == 404
    assert from_amqp(ChannelError(406, "inequivalent arg")).body() == {"error": "bad_request",
                                                                       "reason": "inequivalent arg"}


def test_paged_reply_formats_only_the_page_and_answers_as_list_reply():
    from collections import namedtuple

    from hutch.mgmt.listing import paged_reply

    obj = namedtuple("obj", "name vhost messages")  # queues and exchanges have name and vhost attributes
    objects = [obj(f"q{i % 7}-{i}", "/" if i % 2 else "v", i % 5) for i in range(40)]
    formatted: list[str] = []

    def light(o):
        return {"name": o[0], "vhost": o[1], "messages": o[2]}

    def full(o):
        formatted.append(o[0])
        return {**light(o), "message_stats": {"publish": o[2] * 10}}

    for query in ({"page": "2", "page_size": "5"}, {"page": "1", "sort": "messages", "sort_reverse": "true"},
                  {"page": "1", "name": "q3", "columns": "name"}, {"page": "1", "name": "^q[12]-", "use_regex": "true"},
                  {"page": "1", "sort": "message_stats.publish"}, {}):
        formatted.clear()
        expected = list_reply([full(o) for o in objects], query)
        formatted.clear()
        assert paged_reply(objects, query, light, full) == expected, query
        cheap = "page" in query and query.get("sort", "name") in ("name", "messages")
        assert len(formatted) == (expected["item_count"] if cheap else len(objects)), query
