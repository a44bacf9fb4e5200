"""The OpenAPI description (GET /api/openapi.json, hutch.mgmt.openapi): complete, valid, and true.

* every route the app serves under /api and /metrics is described (the document is generated from the
  route table, and this checks the raw handlers too);
* schemathesis, through its Python API, generates requests for every operation (its coverage cases and a
  few examples each) against a node of its own and checks that none answers 5xx and that every reply's
  status code and body conform to the document. The node is its own because generated requests delete
  and change things (a vhost named "/" is a likely generated name).

`make test` runs, for every operation, its explicit examples and its generated ones (`max_examples`), and
schemathesis' coverage cases (its boundary and negative requests, most of the module's ~10,500 requests) for
a fixed ninth of the operations (`COVERAGE_IN_MAKE_TEST`: by a CRC of the operation's label, the same ninth
in every run and every worker); the coverage cases of the other eight ninths are
`test_api_coverage_cases_conform`, marked slow (`make test-slow`, `make test-all`), with the same checks.

The operations' tests are built when they run, not at collection: schemathesis' own `@schema.parametrize()`
builds every operation's coverage cases (~10,000 in all, ~9 s of CPU) while collecting, in each pytest-xdist
worker, though one worker runs this module (docs/testing.md, "Where the time goes"). Here each test is one
operation (`[METHOD /path]`, the label schemathesis gives it) and builds its Hypothesis test in its own call,
with the same settings, phases and checks.
"""

from __future__ import annotations

import base64
import functools
import zlib
from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance, status_code_conformance
from schemathesis.generation import derive_operation_seed, overrides
from schemathesis.generation.feedback import FeedbackSources
from schemathesis.generation.hypothesis.builder import HypothesisTestConfig, HypothesisTestMode, create_test
from schemathesis.pytest._test_builder import enabled_modes
from schemathesis.python._constants.orchestrator import make_constants_value_source

from conftest import ServerInfo, start_server  # tests/conftest.py
from hutch.mgmt import http, openapi

from .helpers import Api, wait_mgmt

DOCUMENT = openapi.document(http.ROUTES)
OPERATIONS = [f"{method.upper()} {path}" for path, ops in DOCUMENT["paths"].items() for method in ops]
AUTH = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
COVERAGE_IN_MAKE_TEST = frozenset(op for op in OPERATIONS if zlib.crc32(op.encode()) % 9 == 0)
"""The operations whose coverage cases `make test` runs (a fixed ninth, 13 of 150 since session 20; a third
before); the others' are in the slow set."""


def test_every_served_route_is_described():
    from hutch.config import Config
    from hutch.runtime.app import build_node

    app = http.build_app(build_node(Config(data_dir=""), monitor_resources=False))
    served = set()
    for resource in app.router.resources():
        path = resource.canonical
        if path.startswith(("/api", "/metrics")):
            for r in resource:
                if r.method != "HEAD":
                    served.add((r.method.lower(), path))
    described = {(method, path) for path, ops in DOCUMENT["paths"].items() for method in ops}
    # every route also answers with a trailing slash, as RabbitMQ's (http.py): the same operation
    slashed = {(m, p) for m, p in served if p.endswith("/") and (m, p[:-1]) in served and (m, p) not in described}
    assert slashed and all((m, p[:-1]) in described for m, p in slashed)
    assert served - slashed == described
    for path, ops in DOCUMENT["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and op["responses"], (method, path)


def test_document_is_served_and_refers_to_known_schemas(api: Api):
    assert api.ok("/api/openapi.json") == DOCUMENT
    text = str(DOCUMENT)
    for name in SCHEMAS_REFERENCED(text):
        assert name in DOCUMENT["components"]["schemas"], name


def SCHEMAS_REFERENCED(text: str) -> set[str]:  # noqa: N802 - reads as a constant in the test above
    import re

    return set(re.findall(r"#/components/schemas/(\w+)", text))


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerInfo]:
    info = wait_mgmt(start_server(tmp_path_factory.mktemp("openapi")))
    api = Api(info.mgmt_url)
    assert api.put("/api/queues/%2F/q", {"durable": False}).status == 201  # something to find
    yield info
    info.stop()


@functools.cache
def _schema() -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_dict(DOCUMENT)


@settings(max_examples=4, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck))
def _conforms(case: schemathesis.Case, node: ServerInfo, session: requests.Session) -> None:
    # a failed health check is a documented 503, not a server error
    checks = CHECKS[1:] if case.path.startswith(("/api/health", "/api/healthchecks")) else CHECKS
    case.call_and_validate(base_url=node.mgmt_url, headers=AUTH, checks=checks, timeout=10, session=session)


def _run_operation(operation: str, node: ServerInfo, coverage: bool, others: bool) -> None:
    """What schemathesis' `@schema.parametrize()` runs for the operation `operation` (as its
    `build_operation_test` builds it), built here (lazily): its coverage cases if `coverage`, its explicit
    and generated examples if `others`."""
    schema = _schema()
    found = schema.find_operation_by_label(operation)
    assert found is not None, operation
    config = schema.config
    modes = [mode for mode in enabled_modes(config.phases_for(operation=found))
             if (coverage if mode is HypothesisTestMode.COVERAGE else others)]
    assert modes, operation
    phase = "fuzzing" if HypothesisTestMode.FUZZING in modes else None  # only fuzzing uses max_examples
    run = create_test(operation=found, test_func=_conforms, config=HypothesisTestConfig(
        settings=config.get_hypothesis_settings(operation=found, phase=phase),
        explicit_settings=None,
        explicit_setting_names=config.explicit_hypothesis_settings(operation=found, phase=phase),
        modes=modes,
        seed=derive_operation_seed(config.seed, found.label),
        project=config,
        override=overrides.with_config_headers(config, operation=found),
        given_kwargs={},
        feedback=FeedbackSources(constants_value_source=make_constants_value_source(schema))))
    with requests.Session() as session:  # one kept-alive connection for the operation's requests
        session.trust_env = False  # no proxy lookup in the environment per request (a loopback URL)
        run(node=node, session=session)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_api_conforms_to_its_description(operation: str, node: ServerInfo) -> None:
    """The operation's explicit and generated examples, and its coverage cases if it is one of
    `COVERAGE_IN_MAKE_TEST` (the others': `test_api_coverage_cases_conform`, slow)."""
    _run_operation(operation, node, coverage=operation in COVERAGE_IN_MAKE_TEST, others=True)


@pytest.mark.slow
@pytest.mark.parametrize("operation", [op for op in OPERATIONS if op not in COVERAGE_IN_MAKE_TEST])
def test_api_coverage_cases_conform(operation: str, node: ServerInfo) -> None:
    """The coverage cases of the operations `make test` runs without them."""
    _run_operation(operation, node, coverage=True, others=False)
