#!/usr/bin/env bash
# Side-by-side benchmark of hutch and RabbitMQ with hutch-perf (issue 2's scenarios).
#
#   benchmarks/run_core.sh [SECONDS] [ROUNDS]
#
# Needs: a hutch node on $HUTCH_PORT (default 5673) and RabbitMQ on 5672 (guest/guest), both on this
# machine. Runs every scenario against both brokers, alternating, ROUNDS times, and prints one JSON
# summary line per run (hutch-perf --json) prefixed with the broker and scenario name.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-20}
ROUNDS=${2:-2}
HUTCH_PORT=${HUTCH_PORT:-5673}
PERF=${PERF:-.venv/bin/hutch-perf}

declare -A SCENARIOS=(
  [headline_16B]="-x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100"
  [confirm_1kB]="-x 1 -y 1 -s 1000 -c 1000 -q 1000 -A 100"
  [publish_only_16B]="-x 1 -y 0 -s 16"
  [latency_at_10k]="-x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 -r 10000"
)
ORDER=(headline_16B confirm_1kB publish_only_16B latency_at_10k)

for round in $(seq 1 "$ROUNDS"); do
  for name in "${ORDER[@]}"; do
    for broker in hutch rabbitmq; do
      if [ "$broker" = hutch ]; then port=$HUTCH_PORT; else port=5672; fi
      # shellcheck disable=SC2086
      line=$($PERF --uri "amqp://guest:guest@127.0.0.1:$port/%2F" ${SCENARIOS[$name]} -z "$SECONDS_PER_RUN" \
             --json 2>/dev/null | tail -n 1)
      echo "{\"round\": $round, \"broker\": \"$broker\", \"scenario\": \"$name\", \"result\": $line}"
    done
  done
done
