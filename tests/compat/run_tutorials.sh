#!/usr/bin/env bash
# RabbitMQ's tutorials (rabbitmq/rabbitmq-tutorials: python/ on pika, javascript-nodejs/ on amqplib from
# npm at its package.json's version) run as their READMEs run them, each consumer started, then its
# producer, against a broker (docs/compatibility.md "Client suites"). They are scripts, not a suite: a
# tutorial passes when its consumer (or, for RPC, its client) prints what the tutorial says it prints.
#
#   tests/compat/run_tutorials.sh LANG BROKER
#     LANG    python | nodejs
#     BROKER  rabbitmq (the host's, read-only use: the durable queues and exchanges the tutorials declare
#             are deleted afterwards unless they were there before) | hutch (a fresh node, lib.sh)
#
# Environment: WORK [/tmp/hutch-tutorials]; TUTORIALS_GIT [https://github.com/rabbitmq/rabbitmq-tutorials];
# TUTORIALS_REF [main]; HUTCH_WORKERS [2] and the rest of lib.sh's. The log is $WORK/tutorials-LANG-BROKER.log.
set -euo pipefail

lang=${1:?usage: $0 python|nodejs rabbitmq|hutch}
broker=${2:?usage: $0 python|nodejs rabbitmq|hutch}
suite=tutorials-$lang
WORK=${WORK:-/tmp/hutch-tutorials}
TUTORIALS_GIT=${TUTORIALS_GIT:-https://github.com/rabbitmq/rabbitmq-tutorials}
TUTORIALS_REF=${TUTORIALS_REF:-main}
HUTCH_WORKERS=${HUTCH_WORKERS:-2}
WAIT_S=${WAIT_S:-30}
export WORK TUTORIALS_GIT TUTORIALS_REF HUTCH_WORKERS WAIT_S
# shellcheck source=tests/compat/lib.sh
. "$(dirname "$0")/lib.sh"

DURABLE_QUEUES="hello task_queue rpc_queue"
EXCHANGES="logs direct_logs topic_logs"

prepare() {
    checkout "$WORK/tutorials" "$TUTORIALS_GIT" "$TUTORIALS_REF"
    case $lang in
    python)
        if [ ! -x "$WORK/venv-tutorials/bin/python" ]; then
            python3 -m venv "$WORK/venv-tutorials" && "$WORK/venv-tutorials/bin/pip" install -q "pika>=1.0.0"
        fi ;;
    nodejs)  # its package-lock.json's amqplib
        (cd "$WORK/tutorials/javascript-nodejs" && [ -d node_modules/amqplib ] || npm ci --no-audit --no-fund -q) ;;
    *) echo "unknown LANG $lang" >&2; exit 2 ;;
    esac
}

program() {  # program NAME ARGS...: the command line of one tutorial program
    local name=$1; shift
    if [ "$lang" = python ]; then
        echo "$WORK/venv-tutorials/bin/python -u $WORK/tutorials/python/$name.py $*"
    else
        echo "node $WORK/tutorials/javascript-nodejs/src/$name.js $*"
    fi
}

wait_for_line() {  # wait_for_line FILE TEXT: until FILE holds TEXT (fixed string), at most WAIT_S
    for _ in $(seq $((WAIT_S * 10))); do grep -qF -- "$2" "$1" && return 0; sleep 0.1; done
    return 1
}

tutorial() {  # tutorial NAME EXPECTED WHERE CONSUMER -- PRODUCER: WHERE is consumer or producer
    local name=$1 expected=$2 where=$3 consumer=$4 producer=$6
    local out=$WORK/$suite-$broker-$name
    # the tutorials' quoting: arguments are single words or one quoted message
    eval "$consumer" >"$out.consumer" 2>&1 &
    local pid=$!
    local ok=1
    if wait_for_line "$out.consumer" "To exit press CTRL+C" || wait_for_line "$out.consumer" "Awaiting RPC"; then
        eval "timeout $WAIT_S $producer" >"$out.producer" 2>&1 || ok=0
        wait_for_line "$out.$where" "$expected" || ok=0
    else
        ok=0
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    if [ $ok = 1 ]; then echo "PASS $name"; passed=$((passed + 1)); else
        echo "FAIL $name (wanted '$expected' from the $where)"; sed 's/^/    consumer: /' "$out.consumer"
        sed 's/^/    producer: /' "$out.producer" 2>/dev/null || true; failed=$((failed + 1)); fi
}

management() {  # management METHOD PATH: the host RabbitMQ's management API (guest), HTTP status out
    curl -s -o /dev/null -w '%{http_code}' -u guest:guest -X "$1" "http://127.0.0.1:15672/api/$2"
}

run_suite() {
    passed=0 failed=0
    local existed=""
    if [ "$broker" = rabbitmq ]; then
        for q in $DURABLE_QUEUES; do [ "$(management GET "queues/%2F/$q")" = 200 ] && existed="$existed q:$q"; done
        for x in $EXCHANGES; do [ "$(management GET "exchanges/%2F/$x")" = 200 ] && existed="$existed x:$x"; done
    fi
    local quote
    if [ "$lang" = python ]; then quote="'"; else quote="'"; fi
    tutorial hello "Received Hello World!" consumer "$(program receive)" -- "$(program send)"
    tutorial work-queues "Done" consumer "$(program worker)" -- "$(program new_task "'First task.'")"
    tutorial publish-subscribe "info: Hello World!" consumer "$(program receive_logs)" -- "$(program emit_log "'info: Hello World!'")"
    if [ "$lang" = python ]; then
        tutorial routing "info:The message" consumer "$(program receive_logs_direct info)" -- \
            "$(program emit_log_direct info "'The message'")"
        tutorial topics "red.rabbit:Hello" consumer "$(program receive_logs_topic "'*.rabbit'")" -- \
            "$(program emit_log_topic red.rabbit Hello)"
        tutorial rpc "Got 832040" producer "$(program rpc_server)" -- "$(program rpc_client)"
    else
        tutorial routing "info: ${quote}The message${quote}" consumer "$(program receive_logs_direct info)" -- \
            "$(program emit_log_direct info "'The message'")"
        tutorial topics "red.rabbit:${quote}Hello${quote}" consumer "$(program receive_logs_topic "'*.rabbit'")" -- \
            "$(program emit_log_topic red.rabbit Hello)"
        tutorial rpc "Got 832040" producer "$(program rpc_server)" -- "$(program rpc_client 30)"
    fi
    if [ "$broker" = rabbitmq ]; then  # leave the host's broker as it was
        for q in $DURABLE_QUEUES; do
            case "$existed" in *"q:$q"*) ;; *) management DELETE "queues/%2F/$q" >/dev/null ;; esac
        done
        for x in $EXCHANGES; do
            case "$existed" in *"x:$x"*) ;; *) management DELETE "exchanges/%2F/$x" >/dev/null ;; esac
        done
    fi
    echo "$passed passed, $failed failed"
    [ "$failed" = 0 ]
}

compat_main "$0" "$lang" "$broker"
