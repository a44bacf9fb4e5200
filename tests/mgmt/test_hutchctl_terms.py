"""hutchctl's field-table cells (`arguments` of queues, exchanges, bindings and consumers; a connection's
`client_properties`) in rabbitmqctl 3.10.8's table output: Erlang terms (`[]`, `[{"x-queue-type","quorum"}]`),
as rabbitmqctl prints them, where hutchctl printed JSON (`{}`); `--formatter json` keeps JSON objects. The
expected lines are what rabbitmqctl 3.10.8 printed for the same declarations (pika, against the reference
broker, by hand): a queue's arguments in declaration order, a binding's sorted by key, a nested table and
an array as terms, a void as `undefined`, quotes and backslashes escaped."""

from __future__ import annotations

import json

import pika

from hutch.cli.ctl import erlang_term

from .helpers import Api, unique
from .test_hutchctl import ok, rows

MIXED = {"x-message-ttl": 5000, "x-bool": True, "x-list": ["a", 1], "x-table": {"k": "v", "n": 2},
         "x-neg": -3, "x-void": None, "x-quote": 'a"b\\c', "x-big": 2**40}
# rabbitmqctl 3.10.8, `list_queues name arguments`, for the same declaration
MIXED_TERMS = ('[{"x-message-ttl",5000},{"x-bool",true},{"x-list",["a",1]},{"x-table",[{"k","v"},{"n",2}]},'
               '{"x-neg",-3},{"x-void",undefined},{"x-quote","a\\"b\\\\c"},{"x-big",1099511627776}]')


def test_erlang_terms_of_each_field_kind() -> None:
    assert erlang_term({}) == "[]"
    assert erlang_term(MIXED) == MIXED_TERMS
    assert erlang_term({"x-queue-type": "quorum", "x-max-length": 10}) == '[{"x-queue-type","quorum"},{"x-max-length",10}]'
    assert erlang_term({"s": "tab\there"}) == '[{"s","tab\\there"}]'


def test_argument_cells_are_erlang_terms_and_json_stays_json(mgmt) -> None:  # type: ignore[no-untyped-def]
    s = mgmt
    plain, mixed, typed, x = unique("term-plain"), unique("term-mixed"), unique("term-typed"), unique("term-x")
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", s.amqp_port, client_properties={"connection_name": "terms"}))
    ch = conn.channel()
    ch.queue_declare(plain, durable=True)
    ch.queue_declare(mixed, durable=True, arguments=MIXED)
    ch.queue_declare(typed, durable=True, arguments={"x-queue-type": "classic", "x-max-length": 10})
    ch.exchange_declare(x, "headers", arguments={"alternate-exchange": "ae"})
    ch.queue_bind(plain, x, "", arguments={"x-match": "all", "n": 1, "h": "v"})
    ch.basic_consume(plain, lambda *a: None, arguments={"x-priority": 3})
    conn.process_data_events(time_limit=0.2)
    try:
        queues = {r[0]: r[1] for r in rows(ok(s, "-q", "--no-table-headers", "list_queues", "name", "arguments"))}
        assert queues[plain] == "[]"
        assert queues[mixed] == MIXED_TERMS
        assert queues[typed] == '[{"x-queue-type","classic"},{"x-max-length",10}]'
        exchanges = {r[0]: r[1] for r in rows(ok(s, "-q", "list_exchanges", "name", "arguments"))}
        assert exchanges[x] == '[{"alternate-exchange","ae"}]' and exchanges["amq.direct"] == "[]"
        bindings = rows(ok(s, "-q", "list_bindings", "source_name", "destination_name", "arguments"))
        assert [x, plain, '[{"h","v"},{"n",1},{"x-match","all"}]'] in bindings  # sorted by key, as RabbitMQ
        assert ["", plain, "[]"] in bindings
        consumers = {r[0]: r[1] for r in rows(ok(s, "-q", "list_consumers", "queue_name", "arguments"))}
        assert consumers[plain] == '[{"x-priority",3}]'
        props = [r[1] for r in rows(ok(s, "-q", "list_connections", "user_provided_name", "client_properties"))
                 if r[0] == "terms"]
        assert props and props[0].startswith("[{") and '{"connection_name","terms"}' in props[0]
        assert '{"capabilities",[{' in props[0]  # a nested table

        as_json = json.loads(ok(s, "--formatter", "json", "list_queues", "name", "arguments"))
        assert {"name": mixed, "arguments": MIXED} in as_json and {"name": plain, "arguments": {}} in as_json
        bound = json.loads(ok(s, "--formatter", "json", "list_bindings", "source_name", "arguments"))
        assert {"source_name": x, "arguments": {"h": "v", "n": 1, "x-match": "all"}} in bound
    finally:
        conn.close()
        api = Api(s.mgmt_url)
        for q in (plain, mixed, typed):
            api.delete(f"/api/queues/%2F/{q}")
        api.delete(f"/api/exchanges/%2F/{x}")
