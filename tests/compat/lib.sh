# Helpers shared by the client-suite runners (run_stream_client_suites.sh, run_amqp_client_suites.sh):
# a published client's own test suite run against a broker on the suite's fixed ports. Sourced, not run.
#
# A runner defines `prepare` (checkout and install the suite), `run_suite` (run it from the current
# network namespace against localhost) and optionally `hutch_config` (lines for the node's config file,
# on stdout) and `hutch_ready` (what the suite's CI does to its broker before the run), sets
# $suite, $broker and $WORK, then calls `compat_main "$0" ARGS...`.
#
# BROKER is `rabbitmq` (the broker already on the host's ports, read-only use) or `hutch` (a fresh hutch
# node in a private network namespace, `unshare -n`, needs root, so that it takes the suites' ports
# without touching the host's, on a throw-away data directory). HUTCH_WORKERS sets the node's
# `--workers` (the runner gives the default); HUTCH_NODE_ARGS more of its flags (the stream runner's
# `--no-cluster`; without it the node is a cluster of one, as `hutch-server` starts by default, which quorum
# queues need under one worker); HUTCH_SERVER the hutch-server to run; HUTCH_CONF_EXTRA
# lines added to the node's config file (e.g. `max_message_size = 134217728`); LOG_TAG a suffix for the
# log's name (for a run with PYTEST_ARGS or HUTCH_CONF_EXTRA).

compat_here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HUTCH_SERVER=${HUTCH_SERVER:-$compat_here/.venv/bin/hutch-server}
export HUTCH_SERVER

checkout() {  # checkout DIR GIT REF
    if [ ! -d "$1/.git" ]; then git clone -q "$2" "$1"; fi
    # not when it is there already: a checkout takes the index lock, and two runs may share a checkout
    if [ "$(git -C "$1" rev-parse HEAD)" != "$(git -C "$1" rev-parse "$3^{commit}")" ]; then git -C "$1" checkout -q "$3"; fi
}

compat_log() {  # the log file of this suite on this broker (LOG_TAG tells a partial run's apart)
    local name=$broker
    if [ "$broker" = hutch ]; then name=hutch-w$HUTCH_WORKERS; fi
    echo "$WORK/$suite-$name${LOG_TAG:+-$LOG_TAG}.log"
}

in_namespace() {  # runs inside `unshare -n`: a hutch node on the suites' ports, then the suite
    ip link set lo up
    data=$(mktemp -d "$WORK/hutch-data.XXXXXX")
    if declare -F hutch_config >/dev/null; then hutch_config >"$data/hutch.conf"; else : >"$data/hutch.conf"; fi
    if [ -n "${HUTCH_CONF_EXTRA:-}" ]; then printf '%s\n' "$HUTCH_CONF_EXTRA" >>"$data/hutch.conf"; fi
    "$HUTCH_SERVER" --config "$data/hutch.conf" --data-dir "$data" --node-name hutch@localhost \
        --amqp-port 5672 --stream-port 5552 --management-port 15672 ${HUTCH_NODE_ARGS:-} \
        --workers "$HUTCH_WORKERS" --log-level warning >"$data/server.log" 2>&1 &
    pid=$!
    trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$data"' EXIT  # errexit holds in traps
    for _ in $(seq 150); do [ -s "$data/ports.json" ] && break; sleep 0.2; done
    [ -s "$data/ports.json" ] || { cat "$data/server.log" >&2; exit 1; }
    if declare -F hutch_ready >/dev/null; then hutch_ready; fi
    rc=0; (run_suite) || rc=$?
    cp "$data/server.log" "${log%.log}.server.log"
    return $rc
}

compat_main() {  # compat_main SCRIPT ARGS...: run the suite on $broker, print the summary, exit with its code
    local script=$1; shift
    log=$(compat_log)
    if [ "${_IN_NAMESPACE:-}" = 1 ]; then in_namespace; exit $?; fi
    mkdir -p "$WORK"
    prepare
    local rc=0
    case $broker in
    rabbitmq) (run_suite) >"$log" 2>&1 || rc=$? ;;
    hutch) _IN_NAMESPACE=1 unshare -n "$script" "$@" >"$log" 2>&1 || rc=$? ;;
    *) echo "unknown broker $broker" >&2; exit 2 ;;
    esac
    grep -E "passed|failed|passing|failing|pending|error" "$log" | tail -4
    exit $rc
}
