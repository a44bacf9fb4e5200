#!/usr/bin/env bash
# Issue 5's benchmarks, side by side: what queue features cost on a 1 -> 1 queue, and a priority queue.
#
#   benchmarks/run_features.sh [SECONDS] [ROUNDS]
#
# Scenarios (16-byte messages, confirm window 1000, prefetch 1000, multi-ack 100, a fresh queue each run):
#   plain            no arguments
#   maxlen_drophead  x-max-length=1000 (drop-head)
#   ttl              x-message-ttl=60000
#   priority_10      x-max-priority=10, messages published with priorities 0-9 (hutch-perf --priorities)
# Needs a hutch node on $HUTCH_PORT (default 5673) and RabbitMQ on 5672.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_RUN=${1:-10}
ROUNDS=${2:-3}
HUTCH_PORT=${HUTCH_PORT:-5673}
PERF=${PERF:-.venv/bin/hutch-perf}

declare -A ARGS=(
  [plain]=""
  [maxlen_drophead]="--queue-args x-max-length=1000"
  [ttl]="--queue-args x-message-ttl=60000"
  [priority_10]="--queue-args x-max-priority=10 --priorities 10"
)
ORDER=(plain maxlen_drophead ttl priority_10)

for round in $(seq 1 "$ROUNDS"); do
  for name in "${ORDER[@]}"; do
    for broker in hutch rabbitmq; do
      if [ "$broker" = hutch ]; then port=$HUTCH_PORT; else port=5672; fi
      # shellcheck disable=SC2086
      line=$($PERF --uri "amqp://guest:guest@127.0.0.1:$port/%2F" -x 1 -y 1 -s 16 -c 1000 -q 1000 -A 100 \
             ${ARGS[$name]} -z "$SECONDS_PER_RUN" --json 2>/dev/null | tail -n 1)
      echo "{\"round\": $round, \"broker\": \"$broker\", \"scenario\": \"$name\", \"result\": $line}"
    done
  done
done
