#!/usr/bin/env bash
# Run a published stream-protocol client's own integration test suite against a broker (issue 23:
# "each one's own integration tests pass against hutch as they pass against RabbitMQ 3.10.8").
# Not part of `make test`: it needs the clients' repositories (git, npm) and RabbitMQ's fixed ports.
#
#   tests/compat/run_stream_client_suites.sh SUITE BROKER
#     SUITE   rstream | js
#     BROKER  rabbitmq  the broker already listening on localhost 5552/5672/15672 (guest/guest)
#             hutch     a fresh hutch node, in a private network namespace (`unshare -n`, needs root)
#                       so that it takes 5552/5672/15672 as the suites expect without touching the
#                       host's ports, on a throw-away data directory
#
# Environment (defaults in brackets):
#   WORK         scratch directory for the checkouts and logs [/tmp/hutch-stream-client-suites]
#   RSTREAM_GIT  rstream's repository [https://github.com/rabbitmq-community/rstream]
#   RSTREAM_REF  [v1.0.1]  (the newest tag the repository has; PyPI has 1.1.1)
#   JS_GIT       rabbitmq-stream-js-client's repository [https://github.com/rabbitmq/rabbitmq-stream-js-client]
#   JS_REF       [v0.6.2]
#   HUTCH_SERVER the hutch-server to run [the worktree's .venv/bin/hutch-server]
#   HUTCH_WORKERS the node's --workers [1]
#   PYTEST_ARGS / MOCHA_ARGS  extra arguments for the suite (e.g. -k NAME / --grep NAME)
#
# The summary line of the suite is printed last; the whole log is in $WORK/SUITE-rabbitmq.log or
# $WORK/SUITE-hutch-wN.log (the node's own log beside it). The helpers are tests/compat/lib.sh's.
set -euo pipefail

suite=${1:?usage: $0 rstream|js rabbitmq|hutch}
broker=${2:?usage: $0 rstream|js rabbitmq|hutch}
WORK=${WORK:-/tmp/hutch-stream-client-suites}
RSTREAM_GIT=${RSTREAM_GIT:-https://github.com/rabbitmq-community/rstream}
RSTREAM_REF=${RSTREAM_REF:-v1.0.1}
JS_GIT=${JS_GIT:-https://github.com/rabbitmq/rabbitmq-stream-js-client}
JS_REF=${JS_REF:-v0.6.2}
HUTCH_WORKERS=${HUTCH_WORKERS:-1}
HUTCH_NODE_ARGS=${HUTCH_NODE_ARGS---no-cluster}
export WORK RSTREAM_GIT RSTREAM_REF JS_GIT JS_REF HUTCH_WORKERS HUTCH_NODE_ARGS
# shellcheck source=tests/compat/lib.sh
. "$(dirname "$0")/lib.sh"

prepare() {
    case $suite in
    rstream)
        checkout "$WORK/rstream" "$RSTREAM_GIT" "$RSTREAM_REF"
        if [ ! -x "$WORK/venv-rstream/bin/python" ]; then
            python3 -m venv "$WORK/venv-rstream"
            "$WORK/venv-rstream/bin/pip" install -q -e "$WORK/rstream" "pytest>=8.4" "pytest-asyncio>=1.2" requests
        fi ;;
    js)
        checkout "$WORK/js" "$JS_GIT" "$JS_REF"
        if [ ! -d "$WORK/js/node_modules" ]; then (cd "$WORK/js" && npm install --no-audit --no-fund -s); fi ;;
    *) echo "unknown suite $suite" >&2; exit 2 ;;
    esac
}

run_suite() {
    case $suite in
    rstream)
        # test_cluster.py needs a three-node cluster behind a load balancer (its own docker setup).
        cd "$WORK/rstream" && "$WORK/venv-rstream/bin/python" -m pytest -p no:cacheprovider -q -rfE \
            tests --ignore tests/test_cluster.py --rmq-host 127.0.0.1 --rmq-port 5552 ${PYTEST_ARGS:-} ;;
    js)
        # Their CI names the node's host (rabbit@test-node, advertised as test-node, in /etc/hosts) in
        # RABBIT_MQ_TEST_NODES; here the hutch node is hutch@localhost advertising localhost.
        cd "$WORK/js" && RABBITMQ_USER=guest RABBITMQ_PASSWORD=guest RABBIT_MQ_TEST_NODES=localhost:5552 \
            RABBIT_MQ_MANAGEMENT_PORT=15672 RABBIT_MQ_AMQP_PORT=5672 \
            npx mocha --exit --reporter spec --timeout 20000 test/e2e ${MOCHA_ARGS:-} ;;
    esac
}

hutch_config() {
    # As rabbitmq-stream-js-client's CI runs RabbitMQ: the node's host is the host its clients are told
    # to use (rstream's test_query_leader wants the address it connected to: hutch's default).
    if [ "$suite" = js ]; then printf 'stream.advertised_host = localhost\n'; fi
}

hutch_ready() {
    if [ "$suite" = js ]; then  # their CI creates it before the run (rabbitmq-streams add_super_stream)
        "$(dirname "$HUTCH_SERVER")/hutch-streams" --port 5552 add_super_stream super-stream-test --partitions 2
    fi
}

compat_main "$0" "$suite" "$broker"
